// evtc's own sm80 visitor node and the reduction-output helpers of the sm80 kernels.
// #included by every emitted sm80 kernel.
//
// Sm80Immediate follows the CUTLASS 2.x visitor interface of
// cutlass/epilogue/threadblock/fusion/visitor_2x.hpp (get_callbacks -> Callbacks with
// begin_epilogue/begin_step/begin_row/visit/end_row/end_step/end_epilogue).
//
// The sm80 reduction visitors (VisitorColReduction, VisitorRowReduction, VisitorScalarReduction
// in visitor_store.hpp) only ever atomically combine partial results into their output, so the
// output must hold the reduction's identity before the GEMM starts: fill_identity writes it.
// Reductions whose output type is not float accumulate into a float workspace that
// convert_reduction rounds into the output after the GEMM.
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

#include <cutlass/epilogue/threadblock/fusion/visitor_2x.hpp>
#include <cutlass/numeric_conversion.h>

namespace evtc {

// A compile-time constant: returns a fragment filled with the float whose bit pattern is Bits.
// (C++17 has no float template parameters; the bits keep the value exact.)
template <uint32_t Bits>
struct Sm80Immediate : cutlass::epilogue::threadblock::detail::VisitorImpl2x<> {
  using cutlass::epilogue::threadblock::detail::VisitorImpl2x<>::VisitorImpl2x;

  struct Callbacks : cutlass::epilogue::threadblock::detail::EmptyCallbacks {
    template <class ElementAccumulator, int FragmentSize>
    CUTLASS_DEVICE cutlass::Array<float, FragmentSize>
    visit(int, int, int, int, cutlass::Array<ElementAccumulator, FragmentSize> const&) {
      cutlass::Array<float, FragmentSize> r;
      r.fill(__uint_as_float(Bits));
      return r;
    }
  };

  template <class ProblemShape>
  CUTLASS_DEVICE auto get_callbacks(cutlass::gemm::GemmCoord, int, ProblemShape) {
    return Callbacks{};
  }
};

namespace sm80 {

constexpr int kHelperThreads = 256;
constexpr int64_t kHelperMaxBlocks = 1024;

// ptr[l * batch_stride + i] = value for i < count, l < batches.
__global__ void fill_identity_kernel(float* ptr, int64_t count, int64_t batch_stride, int batches, float value) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count * batches;
       i += int64_t(gridDim.x) * blockDim.x) {
    ptr[(i / count) * batch_stride + i % count] = value;
  }
}

// dst[l * batch_stride + i] = T(src[l * count + i]) for i < count, l < batches.
template <class T>
__global__ void convert_reduction_kernel(float const* src, T* dst, int64_t count, int64_t batch_stride, int batches) {
  cutlass::NumericConverter<T, float, cutlass::FloatRoundStyle::round_to_nearest> convert;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count * batches;
       i += int64_t(gridDim.x) * blockDim.x) {
    dst[(i / count) * batch_stride + i % count] = convert(src[i]);
  }
}

inline int helper_blocks(int64_t elements) {
  int64_t blocks = (elements + kHelperThreads - 1) / kHelperThreads;
  return int(blocks < 1 ? 1 : (blocks > kHelperMaxBlocks ? kHelperMaxBlocks : blocks));
}

// Fills a reduction output (count elements per batch) with its identity, on stream.
inline cudaError_t fill_identity(float* ptr, int64_t count, int64_t batch_stride, int batches, float value,
                                 cudaStream_t stream) {
  fill_identity_kernel<<<helper_blocks(count * batches), kHelperThreads, 0, stream>>>(
      ptr, count, batch_stride, batches, value);
  return cudaGetLastError();
}

// Rounds a float reduction workspace (batches x count, packed) into the output, on stream.
template <class T>
inline cudaError_t convert_reduction(float const* src, T* dst, int64_t count, int64_t batch_stride, int batches,
                                     cudaStream_t stream) {
  convert_reduction_kernel<T><<<helper_blocks(count * batches), kHelperThreads, 0, stream>>>(
      src, dst, count, batch_stride, batches);
  return cudaGetLastError();
}

}  // namespace sm80
}  // namespace evtc
