// Packed <-> padded row copies of a 16-bit M x N tensor (the staging route's copies, issue 11):
// cudaMemcpy2DAsync against two copy kernels, and a contiguous copy of the same bytes as the
// ceiling. Standalone (no torch):
//
//   nvcc -O3 -std=c++17 -arch=sm_90a -I codegen_templates/include -o copy_rows benchmarks/micro/copy_rows.cu
//   ./copy_rows 4096 50257
//
// Kernels (packed: row stride N elements; padded: row stride NP, a multiple of 8 = 16 bytes):
//   "vec-src": each thread loads 16 aligned bytes of the side whose rows are contiguous with each
//              other (the packed tensor, read as one flat array) and stores its 8 elements one
//              by one into the other side's rows (2-byte stores; L2 merges them into sectors);
//   "vec-dst": each thread owns 16 bytes of a padded row and moves them with one 16-byte access,
//              the packed side's 8 elements accessed one by one.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <vector>
#include <cuda_runtime.h>

#include <evtc/copy_rows.hpp>  // evtc's own (-I codegen_templates/include)

#define CHECK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); exit(1); } } while (0)

// packed -> padded, reading the packed tensor as flat 16-byte vectors
__global__ void pack_to_pad_vec_src(uint16_t* __restrict__ dst, const uint16_t* __restrict__ src, long M, long N, long NP) {
  long total = M * N;
  long vecs = (total + 7) / 8;
  for (long v = blockIdx.x * (long)blockDim.x + threadIdx.x; v < vecs; v += (long)gridDim.x * blockDim.x) {
    long g = v * 8;
    uint16_t e[8];
    if (g + 8 <= total) {
      uint4 x = __ldg(reinterpret_cast<const uint4*>(src) + v);
      *reinterpret_cast<uint4*>(e) = x;
    } else {
      for (int i = 0; i < 8; ++i) e[i] = g + i < total ? src[g + i] : 0;
    }
    long r = g / N, c = g - r * N;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      if (g + i < total) {
        dst[r * NP + c] = e[i];
      }
      if (++c == N) { c = 0; ++r; }
    }
  }
}

// packed -> padded, one 16-byte store per thread into the padded row
__global__ void pack_to_pad_vec_dst(uint16_t* __restrict__ dst, const uint16_t* __restrict__ src, long M, long N, long NP) {
  long per_row = NP / 8;
  long vecs = M * per_row;
  for (long v = blockIdx.x * (long)blockDim.x + threadIdx.x; v < vecs; v += (long)gridDim.x * blockDim.x) {
    long r = v / per_row, c = (v - r * per_row) * 8;
    uint16_t e[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) e[i] = c + i < N ? __ldg(src + r * N + c + i) : 0;
    *reinterpret_cast<uint4*>(dst + r * NP + c) = *reinterpret_cast<uint4*>(e);
  }
}

// padded -> packed, one 16-byte load per thread from the padded row
__global__ void pad_to_pack_vec_src(uint16_t* __restrict__ dst, const uint16_t* __restrict__ src, long M, long N, long NP) {
  long per_row = NP / 8;
  long vecs = M * per_row;
  for (long v = blockIdx.x * (long)blockDim.x + threadIdx.x; v < vecs; v += (long)gridDim.x * blockDim.x) {
    long r = v / per_row, c = (v - r * per_row) * 8;
    uint16_t e[8];
    *reinterpret_cast<uint4*>(e) = __ldg(reinterpret_cast<const uint4*>(src + r * NP + c));
#pragma unroll
    for (int i = 0; i < 8; ++i) if (c + i < N) dst[r * N + c + i] = e[i];
  }
}

// padded -> packed, one 16-byte store per thread into the packed tensor read as flat vectors
__global__ void pad_to_pack_vec_dst(uint16_t* __restrict__ dst, const uint16_t* __restrict__ src, long M, long N, long NP) {
  long total = M * N;
  long vecs = (total + 7) / 8;
  for (long v = blockIdx.x * (long)blockDim.x + threadIdx.x; v < vecs; v += (long)gridDim.x * blockDim.x) {
    long g = v * 8;
    long r = g / N, c = g - r * N;
    uint16_t e[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      e[i] = g + i < total ? __ldg(src + r * NP + c) : 0;
      if (++c == N) { c = 0; ++r; }
    }
    if (g + 8 <= total) {
      *reinterpret_cast<uint4*>(dst + g) = *reinterpret_cast<uint4*>(e);
    } else {
      for (int i = 0; g + i < total; ++i) dst[g + i] = e[i];
    }
  }
}

// padded -> packed, one 16-byte store per thread; the (at most two) source rows of a vector by
// one pointer select instead of a per-element wrap (needs N >= 8). A candidate for copy_rows.hpp's
// packed destination, not yet measured (added 2026-11-26 after the session's device time ran out).
__global__ void pad_to_pack_vec_dst_select(uint16_t* __restrict__ dst, const uint16_t* __restrict__ src, unsigned M,
                                           unsigned N, unsigned NP) {
  unsigned total = M * N;
  unsigned vecs = (total + 7) / 8;
  for (unsigned v = blockIdx.x * blockDim.x + threadIdx.x; v < vecs; v += gridDim.x * blockDim.x) {
    unsigned g = v * 8;
    unsigned r = g / N, c = g - r * N;
    unsigned rem = N - c;  // elements left in row r
    const uint16_t* p0 = src + r * NP + c;
    const uint16_t* p1 = src + (r + 1) * NP - rem;  // p1[i] is row r+1's element i - rem
    alignas(16) uint16_t e[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) e[i] = g + i < total ? __ldg((unsigned(i) < rem ? p0 : p1) + i) : 0;
    if (g + 8 <= total) {
      *reinterpret_cast<uint4*>(dst + g) = *reinterpret_cast<uint4*>(e);
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) if (g + i < total) dst[g + i] = e[i];
    }
  }
}

template <class F>
float time_ms(F f, int iters = 20) {
  for (int i = 0; i < 3; ++i) f();
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  CHECK(cudaEventRecord(a));
  for (int i = 0; i < iters; ++i) f();
  CHECK(cudaEventRecord(b));
  CHECK(cudaEventSynchronize(b));
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, a, b));
  CHECK(cudaGetLastError());
  return ms / iters;
}

int main(int argc, char** argv) {
  long M = argc > 1 ? atol(argv[1]) : 4096, N = argc > 2 ? atol(argv[2]) : 50257;
  long NP = (N + 7) / 8 * 8;
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  uint16_t *packed, *padded, *packed2, *flat;
  CHECK(cudaMalloc(&packed, M * N * 2));
  CHECK(cudaMalloc(&packed2, M * N * 2));
  CHECK(cudaMalloc(&padded, M * NP * 2));
  CHECK(cudaMalloc(&flat, M * N * 2));
  std::vector<uint16_t> h(M * N);
  for (long i = 0; i < M * N; ++i) h[i] = uint16_t((i * 2654435761u) >> 7);
  CHECK(cudaMemcpy(packed, h.data(), M * N * 2, cudaMemcpyHostToDevice));
  double gb = 2.0 * M * N * 2 / 1e9;
  int grid = sms * 8, block = 256;
  auto report = [&](char const* what, float ms, bool ok) {
    printf("%-34s %8.1f us  %5.2f TB/s  %s\n", what, ms * 1e3, gb / ms, ok ? "ok" : "WRONG");
  };
  auto check_padded = [&]() {
    std::vector<uint16_t> p(M * NP);
    CHECK(cudaMemcpy(p.data(), padded, M * NP * 2, cudaMemcpyDeviceToHost));
    for (long r = 0; r < M; ++r)
      for (long c = 0; c < N; ++c)
        if (p[r * NP + c] != h[r * N + c]) return false;
    return true;
  };
  auto check_packed2 = [&](long count) {  // the first `count` elements
    std::vector<uint16_t> p(count);
    CHECK(cudaMemcpy(p.data(), packed2, count * 2, cudaMemcpyDeviceToHost));
    return std::equal(p.begin(), p.end(), h.begin());
  };
  // each copy into a zeroed destination, timed, then checked against the host data
  auto to_padded = [&](char const* what, auto copy) {
    CHECK(cudaMemset(padded, 0, M * NP * 2));
    float t = time_ms(copy);
    report(what, t, check_padded());
  };
  auto to_packed = [&](char const* what, auto copy, long count) {
    CHECK(cudaMemset(packed2, 0, M * N * 2));
    float t = time_ms(copy);
    report(what, t, check_packed2(count));
  };
  printf("M=%ld N=%ld NP=%ld, %d SMs, %.3f GB moved per copy\n", M, N, NP, sms, gb);
  report("contiguous cudaMemcpyAsync", time_ms([&] { cudaMemcpyAsync(flat, packed, M * N * 2, cudaMemcpyDeviceToDevice); }), true);
  to_padded("pack->pad cudaMemcpy2DAsync",
            [&] { cudaMemcpy2DAsync(padded, NP * 2, packed, N * 2, N * 2, M, cudaMemcpyDeviceToDevice); });
  to_padded("pack->pad vec-src kernel", [&] { pack_to_pad_vec_src<<<grid, block>>>(padded, packed, M, N, NP); });
  to_padded("pack->pad vec-dst kernel", [&] { pack_to_pad_vec_dst<<<grid, block>>>(padded, packed, M, N, NP); });
  // padded now holds the data: copy it back
  to_packed("pad->pack cudaMemcpy2DAsync",
            [&] { cudaMemcpy2DAsync(packed2, N * 2, padded, NP * 2, N * 2, M, cudaMemcpyDeviceToDevice); }, M * N);
  to_packed("pad->pack vec-src kernel", [&] { pad_to_pack_vec_src<<<grid, block>>>(packed2, padded, M, N, NP); }, M * N);
  to_packed("pad->pack vec-dst kernel", [&] { pad_to_pack_vec_dst<<<grid, block>>>(packed2, padded, M, N, NP); }, M * N);
  to_packed("pad->pack vec-dst select kernel",
            [&] { pad_to_pack_vec_dst_select<<<grid, block>>>(packed2, padded, unsigned(M), unsigned(N), unsigned(NP)); },
            M * N);
  // evtc's kernels (codegen_templates/include/evtc/copy_rows.hpp), both ways
  to_padded("pack->pad evtc::copy_rows", [&] { evtc::copy_rows(padded, NP, 0, packed, N, 0, 1, M, N, 2, sms, 0); });
  to_packed("pad->pack evtc::copy_rows", [&] { evtc::copy_rows(packed2, N, 0, padded, NP, 0, 1, M, N, 2, sms, 0); },
            M * N);
  // batched (L = 3 of M / 3 rows): rows wrap across batches
  long Lb = 3, Mb = M / 3;
  to_packed("pad->pack evtc::copy_rows, L=3",
            [&] { evtc::copy_rows(packed2, N, Mb * N, padded, NP, Mb * NP, Lb, Mb, N, 2, sms, 0); }, Lb * Mb * N);
  return 0;
}
