// Row copies between a packed and a padded M x N tensor, for the padded staging route
// (evtc/runtime/staging.py, NOTE [Copy kernels for staging] in evtc/runtime/pitched_copy.py).
//
// dst[l][r][c] = src[l][r][c] for l < L, r < M, c < N, with element strides (ld, batch) on each
// side and unit column stride. Each thread stores one 16-byte vector of the destination, whose
// rows are 16-byte aligned (the padded buffer evtc allocates) or which is one packed array (a
// caller's output), and loads its elements from the source one by one. Measured on the H100
// (benchmarks/micro/copy_rows.cu, 4096 x 50257 bf16 into rows of 50264): 312 us against
// cudaMemcpy2DAsync's 384 us, and 2.5-2.6 against 1.4-1.5 TB/s at N = 4097 and 14337; the other
// way (padded to packed) 368 against 383 us, and 2.1-2.2 against 1.4-1.5 TB/s. Loading aligned
// vectors and storing elements one by one ran at 0.7 TB/s.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cuda_runtime.h>

namespace evtc {
namespace detail {

template <int Bytes>
struct CopyWord;
template <>
struct CopyWord<1> { using type = uint8_t; };
template <>
struct CopyWord<2> { using type = uint16_t; };
template <>
struct CopyWord<4> { using type = uint32_t; };

// Every thread stores one 16-byte vector of the destination and gathers its elements from the
// source one by one (loads of any alignment are cheap; 2-byte stores are not). FlatDst: the
// destination is one contiguous L*M*N array (a packed tensor: the copy back into a caller's
// output); else its rows are 16-byte aligned (the padded buffer the route allocates).
// Index: uint32_t where every index fits (one 32-bit division per vector instead of 64-bit ones,
// which cost more than the memory traffic at these sizes), else int64_t.
template <int Bytes, bool FlatDst, class Index>
__global__ void copy_rows_kernel(void* __restrict__ dst_, Index ld_dst, Index bs_dst, void const* __restrict__ src_,
                                 Index ld_src, Index bs_src, Index L, Index M, Index N) {
  using T = typename CopyWord<Bytes>::type;
  constexpr int kVec = 16 / Bytes;
  T* dst = static_cast<T*>(dst_);
  T const* src = static_cast<T const*>(src_);
  alignas(16) T e[kVec];
  Index const stride = Index(gridDim.x) * blockDim.x;
  if (FlatDst) {
    Index const total = L * M * N;
    Index const vecs = (total + kVec - 1) / kVec;
    for (Index v = blockIdx.x * Index(blockDim.x) + threadIdx.x; v < vecs; v += stride) {
      Index const g = v * kVec;
      Index row = g / N, c = g - row * N;
      Index l = 0, r = row;
      if (L > 1) {
        l = row / M;
        r = row - l * M;
      }
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        e[i] = g + i < total ? __ldg(src + l * bs_src + r * ld_src + c) : T(0);
        if (++c == N) {
          c = 0;
          if (++r == M) {
            r = 0;
            ++l;
          }
        }
      }
      if (g + kVec <= total) {
        *reinterpret_cast<uint4*>(dst + g) = *reinterpret_cast<uint4 const*>(e);
      } else {
#pragma unroll
        for (int i = 0; i < kVec; ++i) {  // constant indices: e stays in registers
          if (g + i < total) dst[g + i] = e[i];
        }
      }
    }
  } else {
    Index const per_row = (N + kVec - 1) / kVec;
    Index const vecs = L * M * per_row;
    for (Index v = blockIdx.x * Index(blockDim.x) + threadIdx.x; v < vecs; v += stride) {
      Index const row = v / per_row;  // l * M + r
      Index const c = (v - row * per_row) * kVec;
      Index l = 0, r = row;
      if (L > 1) {
        l = row / M;
        r = row - l * M;
      }
      T* d = dst + l * bs_dst + r * ld_dst + c;
      T const* s = src + l * bs_src + r * ld_src + c;
      bool const whole = c + kVec <= N;  // the row's last vector may end past N: element by element
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        e[i] = (whole || c + i < N) ? __ldg(s + i) : T(0);
      }
      if (whole) {
        *reinterpret_cast<uint4*>(d) = *reinterpret_cast<uint4 const*>(e);
      } else {
#pragma unroll
        for (int i = 0; i < kVec; ++i) {  // constant indices: e stays in registers
          if (c + i < N) d[i] = e[i];
        }
      }
    }
  }
}

template <int Bytes, bool FlatDst>
cudaError_t launch_copy_rows(void* dst, int64_t ld_dst, int64_t bs_dst, void const* src, int64_t ld_src,
                             int64_t bs_src, int64_t L, int64_t M, int64_t N, int sm_count, cudaStream_t stream) {
  constexpr int kVec = 16 / Bytes;
  int64_t const vecs = FlatDst ? (L * M * N + kVec - 1) / kVec : L * M * ((N + kVec - 1) / kVec);
  int const block = 256;
  int64_t blocks = (vecs + block - 1) / block;
  int64_t const most = int64_t(sm_count > 0 ? sm_count : 132) * 8;  // a grid-stride loop past 8 blocks per SM
  dim3 const grid(unsigned(blocks < most ? blocks : most));
  // every element offset of either side, and the vector counts with a grid's stride beyond them
  auto span = [&](int64_t ld, int64_t bs) { return (L - 1) * bs + (M - 1) * ld + N; };
  int64_t const largest = std::max({span(ld_dst, bs_dst), span(ld_src, bs_src), L * M * N + kVec, vecs * kVec}) +
                          int64_t(grid.x) * block * kVec;
  if (largest < (int64_t(1) << 32) && ld_dst >= 0 && bs_dst >= 0 && ld_src >= 0 && bs_src >= 0) {
    copy_rows_kernel<Bytes, FlatDst, uint32_t><<<grid, dim3(block), 0, stream>>>(
        dst, uint32_t(ld_dst), uint32_t(bs_dst), src, uint32_t(ld_src), uint32_t(bs_src), uint32_t(L), uint32_t(M),
        uint32_t(N));
  } else {
    copy_rows_kernel<Bytes, FlatDst, int64_t><<<grid, dim3(block), 0, stream>>>(dst, ld_dst, bs_dst, src, ld_src,
                                                                                bs_src, L, M, N);
  }
  return cudaGetLastError();
}

}  // namespace detail

// The copy, or cudaErrorInvalidValue when it does not apply (an element size other than 1, 2 or
// 4 bytes; a destination neither packed nor with 16-byte aligned rows): the caller copies
// another way.
inline cudaError_t copy_rows(void* dst, int64_t ld_dst, int64_t bs_dst, void const* src, int64_t ld_src, int64_t bs_src,
                             int64_t L, int64_t M, int64_t N, int elem_bytes, int sm_count, cudaStream_t stream) {
  if (L <= 0 || M <= 0 || N <= 0) {
    return cudaSuccess;
  }
  bool const base_aligned = reinterpret_cast<uintptr_t>(dst) % 16 == 0;
  bool const rows_aligned = base_aligned && (ld_dst * elem_bytes) % 16 == 0 && (L == 1 || (bs_dst * elem_bytes) % 16 == 0);
  bool const flat = base_aligned && (M == 1 || ld_dst == N) && (L == 1 || bs_dst == M * N);
  if (!rows_aligned && !flat) {
    return cudaErrorInvalidValue;
  }
#define EVTC_COPY_ROWS_CASE(B)                                                                                 \
  case B:                                                                                                      \
    return rows_aligned ? detail::launch_copy_rows<B, false>(dst, ld_dst, bs_dst, src, ld_src, bs_src, L, M, N, \
                                                             sm_count, stream)                                 \
                        : detail::launch_copy_rows<B, true>(dst, ld_dst, bs_dst, src, ld_src, bs_src, L, M, N,  \
                                                            sm_count, stream);
  switch (elem_bytes) {
    EVTC_COPY_ROWS_CASE(1)
    EVTC_COPY_ROWS_CASE(2)
    EVTC_COPY_ROWS_CASE(4)
    default:
      return cudaErrorInvalidValue;
  }
#undef EVTC_COPY_ROWS_CASE
}

}  // namespace evtc
