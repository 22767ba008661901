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
// NOTE [The sm80 scalar reduction's writing lane]: CUTLASS's VisitorScalarReduction
// (epilogue/threadblock/fusion/visitor_store.hpp, CUTLASS 4.2) reduces its partials across the
// warp with a butterfly, which leaves the warp's total in every lane, then lets every lane add it
// atomically: its is_writing_thread (lane 0) is set and never read. A max or min doesn't mind
// (the same value 32 times); a sum comes out 32 times too large (the sm80 fuzz epilogues with a
// scalar sum failed on the H200, 2026-11-29). This is the same visitor with the atomic from lane 0.
template <template <class> class RegReduceFn, template <class> class AtomicReduceFn, class ThreadMap,
          class ElementOutput, class ElementCompute, cutlass::FloatRoundStyle RoundStyle, class StrideMNL>
struct Sm80ScalarReduction : cutlass::epilogue::threadblock::VisitorScalarReduction<
    RegReduceFn, AtomicReduceFn, ThreadMap, ElementOutput, ElementCompute, RoundStyle, StrideMNL> {
  using Base = cutlass::epilogue::threadblock::VisitorScalarReduction<
      RegReduceFn, AtomicReduceFn, ThreadMap, ElementOutput, ElementCompute, RoundStyle, StrideMNL>;
  using Base::Base;

  template <class CTensor, class GTensor, class ProblemShape>
  struct Callbacks : Base::template Callbacks<CTensor, GTensor, ProblemShape> {
    using BaseCallbacks = typename Base::template Callbacks<CTensor, GTensor, ProblemShape>;
    using BaseCallbacks::BaseCallbacks;

    CUTLASS_DEVICE auto end_epilogue() {
      using namespace cutlass::epilogue::threadblock;
      intra_warp_row_reduce<RegReduceFn, ThreadMap::kWarpSize>(this->reduction_accum);
      if (this->is_writing_thread) {
        atomic_reduce<AtomicReduceFn, RoundStyle>(&this->tC_gScalar(cute::_0{}, cute::_0{}), this->reduction_accum);
      }
    }
  };

  template <class ProblemShape>
  CUTLASS_DEVICE auto get_callbacks(cutlass::gemm::GemmCoord threadblock_tile_offset, int thread_idx,
                                    ProblemShape problem_shape) {
    using namespace cute;
    Tensor cSrc = make_identity_tensor(problem_shape);
    Tensor tC_cSrc = group_modes<2, 5>(ThreadMap::partition(cSrc, thread_idx, threadblock_tile_offset)(_0{}, _, _, _, _, _));
    Tensor mScalar = make_tensor(make_gmem_ptr(this->params_ptr->ptr_scalar), problem_shape, this->params_ptr->dScalar);
    Tensor tC_gScalar = mScalar(_, _, threadblock_tile_offset.k());
    return Callbacks<decltype(tC_cSrc), decltype(tC_gScalar), ProblemShape>(
        cute::move(tC_cSrc), cute::move(tC_gScalar), problem_shape, this->params_ptr, thread_idx);
  }
};

}  // namespace evtc
