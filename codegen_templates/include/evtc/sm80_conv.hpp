// evtc's sm80 implicit-GEMM convolution with a visitor epilogue (CUTLASS 2.x).
//
// NOTE [A 2.x convolution with a visitor epilogue]
// CUTLASS 2.x has visitor epilogues (epilogue/threadblock/epilogue_with_visitor_callbacks.h) only
// for GEMMs (gemm/kernel/gemm_universal_with_visitor.h) and no conv kernel that calls them. This
// kernel is conv/kernel/implicit_gemm_convolution.h's (the same mainloop, iterators, grid and
// swizzle; from CUTLASS's DefaultConv{2,3}d{Fprop,Dgrad,Wgrad} of the kind) with its epilogue
// call replaced by the visitor epilogue's, which GemmWithEpilogueVisitor makes:
// `epilogue(accumulators, threadblock_tile_offset, problem_shape, thread_idx)` with the implicit
// GEMM's problem shape (M, N, 1). The visitor tree sees the GEMM's M x N output: row m of the
// implicit GEMM is the m-th packed row of the output (NPQK for fprop, NHWC for dgrad, K x RSC
// for wgrad), so the visitors take the output's row-major (ld, _1, 0) stride as for a GEMM.
// No split-K (the visitors would need the serial reduction's semaphore; CUTLASS's sm80 EVT
// GEMM refuses split-K as well).
#pragma once

#include <cutlass/cutlass.h>
#include <cutlass/fast_math.h>
#include <cutlass/gemm/gemm.h>
#include <cutlass/matrix_coord.h>
#include <cutlass/conv/convolution.h>
#include <cutlass/conv/conv2d_problem_size.h>
#include <cutlass/conv/conv3d_problem_size.h>
#include <cute/tensor.hpp>

namespace evtc {
namespace conv {

template <typename Mma_, typename Epilogue_, typename ThreadblockSwizzle_, cutlass::conv::Operator ConvOperator,
          typename ConvProblemSize_>
struct ImplicitGemmConvolutionWithVisitor {
  using Mma = Mma_;
  using Epilogue = Epilogue_;
  using FusionCallbacks = typename Epilogue::FusionCallbacks;
  using ThreadblockSwizzle = ThreadblockSwizzle_;
  using ConvProblemSize = ConvProblemSize_;
  static cutlass::conv::Operator const kConvolutionalOperator = ConvOperator;

  using ElementA = typename Mma::IteratorA::Element;
  using LayoutA = typename Mma::IteratorA::Layout;
  using ElementB = typename Mma::IteratorB::Element;
  using LayoutB = typename Mma::IteratorB::Layout;
  using ThreadblockShape = typename Mma::Shape;
  using WarpCount = typename Mma::WarpCount;
  static int const kThreadCount = 32 * WarpCount::kCount;
  static cutlass::conv::IteratorAlgorithm const kIteratorAlgorithm = Mma::IteratorA::kIteratorAlgorithm;

  struct Arguments {
    ConvProblemSize problem_size;
    void const* ptr_A = nullptr;  // fprop x, dgrad dy, wgrad dy; packed
    void const* ptr_B = nullptr;  // fprop and dgrad w, wgrad x; packed
    typename FusionCallbacks::Arguments epilogue;
  };

  struct Params {
    ConvProblemSize problem_size;
    cutlass::gemm::GemmCoord grid_tiled_shape;
    cutlass::gemm::GemmCoord implicit_gemm_problem_size;
    int swizzle_log_tile = 0;
    int gemm_k_iterations = 0;
    int gemm_k_iterations_per_channel = 0;
    typename Mma::IteratorA::Params iterator_A;
    ElementA const* ptr_A = nullptr;
    typename Mma::IteratorB::Params iterator_B;
    ElementB const* ptr_B = nullptr;
    typename FusionCallbacks::Params output_op;
    cute::Shape<int32_t, int32_t, int32_t> problem_shape;  // (M, N, L = 1) of the implicit GEMM

    Params() = default;

    explicit Params(Arguments const& args)
        : problem_size(args.problem_size),
          implicit_gemm_problem_size(cutlass::conv::implicit_gemm_problem_size(kConvolutionalOperator, args.problem_size)),
          iterator_A(Mma::IteratorA::getParams(
              args.problem_size,
              LayoutA::packed(cutlass::conv::implicit_gemm_tensor_a_extent(kConvolutionalOperator, args.problem_size)))),
          ptr_A(static_cast<ElementA const*>(args.ptr_A)),
          iterator_B(args.problem_size,
                     LayoutB::packed(cutlass::conv::implicit_gemm_tensor_b_extent(kConvolutionalOperator, args.problem_size))),
          ptr_B(static_cast<ElementB const*>(args.ptr_B)),
          output_op(FusionCallbacks::to_underlying_arguments(
              cutlass::conv::implicit_gemm_problem_size(kConvolutionalOperator, args.problem_size), args.epilogue,
              nullptr /*workspace*/)),
          problem_shape({implicit_gemm_problem_size.m(), implicit_gemm_problem_size.n(), 1}) {
      gemm_k_iterations = cutlass::conv::implicit_gemm_k_iterations(kConvolutionalOperator, ThreadblockShape::kK,
                                                                    args.problem_size, kIteratorAlgorithm,
                                                                    cutlass::conv::GroupMode::kNone, ThreadblockShape::kN);
      gemm_k_iterations_per_channel =
          cutlass::conv::implicit_gemm_k_iterations_per_channel(kConvolutionalOperator, args.problem_size, kIteratorAlgorithm);
      ThreadblockSwizzle threadblock_swizzle;
      grid_tiled_shape = threadblock_swizzle.get_tiled_shape(
          implicit_gemm_problem_size, {ThreadblockShape::kM, ThreadblockShape::kN, ThreadblockShape::kK}, 1);
      swizzle_log_tile = threadblock_swizzle.get_log_tile(grid_tiled_shape);
    }
  };

  union SharedStorage {
    typename Mma::SharedStorage main_loop;
    typename Epilogue::SharedStorage epilogue;
  };

  /// CUTLASS's iterators' own checks (channels in whole vectors, filter extents).
  static cutlass::Status can_implement(Arguments const& args) {
    cutlass::Status status = Mma::IteratorA::can_implement(args.problem_size);
    if (status != cutlass::Status::kSuccess) {
      return status;
    }
    return Mma::IteratorB::can_implement(args.problem_size);
  }

  static dim3 grid_shape(Params const& params) {
    ThreadblockSwizzle threadblock_swizzle;
    return threadblock_swizzle.get_grid_shape(params.grid_tiled_shape);
  }

  CUTLASS_HOST_DEVICE
  ImplicitGemmConvolutionWithVisitor() {}

  CUTLASS_DEVICE
  void operator()(Params const& params, SharedStorage& shared_storage) {
    ThreadblockSwizzle threadblock_swizzle;
    cutlass::gemm::GemmCoord threadblock_tile_idx = threadblock_swizzle.get_tile_offset(params.swizzle_log_tile);
    if (params.grid_tiled_shape.m() <= threadblock_tile_idx.m() ||
        params.grid_tiled_shape.n() <= threadblock_tile_idx.n()) {
      return;
    }
    int thread_idx = threadIdx.x;
    typename Mma::IteratorA iterator_A(params.iterator_A, params.problem_size, params.ptr_A, thread_idx,
                                       cutlass::MatrixCoord(threadblock_tile_idx.m() * Mma::Shape::kM,
                                                            threadblock_tile_idx.k() * Mma::Shape::kK));
    typename Mma::IteratorB iterator_B(params.iterator_B, params.problem_size, params.ptr_B, thread_idx,
                                       cutlass::MatrixCoord(threadblock_tile_idx.k() * Mma::Shape::kK,
                                                            threadblock_tile_idx.n() * Mma::Shape::kN));
    int warp_idx = cutlass::canonical_warp_idx_sync();
    int lane_idx = threadIdx.x % 32;

    Mma mma(shared_storage.main_loop, thread_idx, warp_idx, lane_idx);
    typename Mma::FragmentC accumulators;
    accumulators.clear();
    mma(params.gemm_k_iterations, accumulators, iterator_A, iterator_B, accumulators,
        params.gemm_k_iterations_per_channel);

    // the visitor epilogue over the implicit GEMM's (M, N, 1) (NOTE above); the mainloop and the
    // epilogue share shared memory (a union), so wait until every warp is done with the former
    __syncthreads();
    threadblock_tile_idx = threadblock_swizzle.get_tile_offset(params.swizzle_log_tile);
    Epilogue epilogue(params.output_op, shared_storage.epilogue, thread_idx, warp_idx, lane_idx);
    epilogue(accumulators, threadblock_tile_idx, params.problem_shape, thread_idx);
  }
};

}  // namespace conv
}  // namespace evtc
