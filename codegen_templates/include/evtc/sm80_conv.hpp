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


// ---- 2-D strided dgrad ---------------------------------------------------------------------------
//
// NOTE [Strided dgrad rows]
// CUTLASS's strided-dgrad kernel (conv/kernel/implicit_gemm_convolution_strided_dgrad.h) splits
// dx by the filter's stride phases: the CTA tiles along M come in stride_h * stride_w groups of
// tile_m_per_filter tiles (threadblock_swizzle.h, conv2d_problem_size.h
// strided_dgrad_tile_m_per_filter); the tiles of phase (start_r, start_s) compute the dx pixels
// (start_h + p * stride_h, start_w + q * stride_w), p < p_ = ceil((H - start_h) / stride_h), q < q_,
// in (n, p, q) order, one implicit-GEMM row each. So row m of such a tile is not dx's row m: with
// npq = m - (first row of the phase), dx's row is
//
//     n * H * W + (start_h + p * stride_h) * W + (start_w + q * stride_w),
//     n = npq / (p_ * q_),  p = (npq % (p_ * q_)) / q_,  q = npq % q_,
//
// and rows with npq >= N * p_ * q_ (the phase's padding up to whole tiles) are no pixel at all.
// CUTLASS's epilogue iterator (epilogue/threadblock/predicated_tile_iterator_strided_dgrad.h)
// maps every row that way with hardware division. evtc's visitor epilogue gives the visitors
// that address rows (aux loads, aux stores, column broadcasts, row reductions) this map, computed
// with cutlass::FastDivmod (divisors made once per CTA from the phase) or with plain division: a
// compile-time choice per direction (kFast for loads and stores), measured in
// benchmarks/bench_conv.py. The other reductions (over M, and scalar) only need to drop the rows
// that are no pixel (StridedDgradMasked: no division). The visitors see the implicit GEMM's
// (M, N, 1) with M = the CTA tiles' rows (tiles x kM), so stock visitors that index columns only
// (row broadcasts, scalars, computes) need nothing.

/// What the strided-dgrad row map needs of the problem (host-filled).
struct StridedDgradGeometry {
  int n = 0, h = 0, w = 0;            // dx: batch, height, width
  int stride_h = 1, stride_w = 1;
  int pad_h = 0, pad_w = 0;
  int tile_m_per_filter = 1;          // CTA tiles of one stride phase
  int tile_m = 1;                     // rows of a CTA tile (ThreadblockShape::kM)
};

/// Quotient and remainder by a divisor fixed per CTA: cutlass::FastDivmod (kFast) or plain
/// division.
template <bool kFast>
struct RowDivisor;

template <>
struct RowDivisor<true> {
  cutlass::FastDivmod d;
  RowDivisor() = default;
  CUTLASS_DEVICE explicit RowDivisor(int divisor) : d(divisor) {}
  CUTLASS_DEVICE void operator()(int& quotient, int& remainder, int dividend) const { d(quotient, remainder, dividend); }
};

template <>
struct RowDivisor<false> {
  int d = 1;
  RowDivisor() = default;
  CUTLASS_DEVICE explicit RowDivisor(int divisor) : d(divisor) {}
  CUTLASS_DEVICE void operator()(int& quotient, int& remainder, int dividend) const {
    quotient = dividend / d;
    remainder = dividend % d;
  }
};

/// The row map of one CTA tile (NOTE [Strided dgrad rows]).
template <bool kFast>
struct StridedDgradRows {
  int phase_base = 0;  // implicit-GEMM row of the phase's first pixel
  int rows = 0;        // pixels of the phase: N * p_ * q_
  int start_h = 0, start_w = 0, stride_h = 1, stride_w = 1, w = 1, hw = 1;
  RowDivisor<kFast> by_pq, by_q;

  StridedDgradRows() = default;

  /// The phase of CTA tile `tile_m` as the kernel computes it (start_r, start_s from the tile,
  /// then CUTLASS's strided_dgrad_starting_coords for cross-correlation).
  CUTLASS_DEVICE StridedDgradRows(StridedDgradGeometry const& g, int tile_m) {
    int filter_tile_m = tile_m / g.tile_m_per_filter;
    int start_r = filter_tile_m / g.stride_w;
    int start_s = filter_tile_m % g.stride_w;
    int r_ = g.stride_h - (g.pad_h % g.stride_h - start_r);
    int s_ = g.stride_w - (g.pad_w % g.stride_w - start_s);
    start_h = (r_ < 0 ? -r_ : r_) % g.stride_h;
    start_w = (s_ < 0 ? -s_ : s_) % g.stride_w;
    int p = (g.h - start_h + g.stride_h - 1) / g.stride_h;
    int q = (g.w - start_w + g.stride_w - 1) / g.stride_w;
    phase_base = filter_tile_m * g.tile_m_per_filter * g.tile_m;
    rows = g.n * p * q;
    stride_h = g.stride_h;
    stride_w = g.stride_w;
    w = g.w;
    hw = g.h * g.w;
    by_pq = RowDivisor<kFast>(p * q > 0 ? p * q : 1);
    by_q = RowDivisor<kFast>(q > 0 ? q : 1);
  }

  /// Whether implicit-GEMM row `m` of the tile is a pixel of dx.
  CUTLASS_DEVICE bool valid(int m) const { return m - phase_base < rows; }

  /// dx's row (pixel) of implicit-GEMM row `m` (meaningful when valid(m)).
  CUTLASS_DEVICE int64_t row(int m) const {
    int n, pq, p, q;
    by_pq(n, pq, m - phase_base);
    by_q(p, q, pq);
    return int64_t(n) * hw + int64_t(start_h + p * stride_h) * w + (start_w + q * stride_w);
  }
};

/// The 2-D strided-dgrad kernel with a visitor epilogue: CUTLASS's ImplicitGemmConvolutionStridedDgrad
/// (the same mainloop, iterators, swizzle and early exit of phases outside dx) with its epilogue
/// call replaced by the visitor epilogue's over (M, N, 1), M = the CTA tiles' rows. The visitors that
/// address rows map them to dx's pixels themselves (NOTE [Strided dgrad rows]).
template <typename Mma_, typename Epilogue_, typename ThreadblockSwizzle_>
struct ImplicitGemmConvolutionStridedDgradWithVisitor {
  using Mma = Mma_;
  using Epilogue = Epilogue_;
  using FusionCallbacks = typename Epilogue::FusionCallbacks;
  using ThreadblockSwizzle = ThreadblockSwizzle_;
  using ConvProblemSize = cutlass::conv::Conv2dProblemSize;
  static cutlass::conv::Operator const kConvolutionalOperator = cutlass::conv::Operator::kDgrad;
  using ElementA = typename Mma::IteratorA::Element;
  using LayoutA = typename Mma::IteratorA::Layout;
  using ElementB = typename Mma::IteratorB::Element;
  using LayoutB = typename Mma::IteratorB::Layout;
  using ThreadblockShape = typename Mma::Shape;
  using WarpCount = typename Mma::WarpCount;
  static int const kThreadCount = 32 * WarpCount::kCount;

  struct Arguments {
    ConvProblemSize problem_size;
    void const* ptr_A = nullptr;  // dy, packed NPQK
    void const* ptr_B = nullptr;  // w, packed KRSC
    typename FusionCallbacks::Arguments epilogue;
  };

  struct Params {
    ConvProblemSize problem_size;
    cutlass::gemm::GemmCoord grid_tiled_shape;
    int swizzle_log_tile = 0;
    cutlass::FastDivmod stride_h_divmod;
    cutlass::FastDivmod stride_w_divmod;
    int gemm_k_iterations = 0;
    typename Mma::IteratorA::Params iterator_A;
    ElementA const* ptr_A = nullptr;
    typename Mma::IteratorB::Params iterator_B;
    ElementB const* ptr_B = nullptr;
    typename FusionCallbacks::Params output_op;
    cute::Shape<int32_t, int32_t, int32_t> problem_shape;  // (CTA tiles' rows, C, 1)

    Params() = default;

    explicit Params(Arguments const& args)
        : problem_size(args.problem_size),
          stride_h_divmod(args.problem_size.stride_h),
          stride_w_divmod(args.problem_size.stride_w),
          iterator_A(Mma::IteratorA::getParams(
              args.problem_size,
              LayoutA::packed(cutlass::conv::implicit_gemm_tensor_a_extent(kConvolutionalOperator, args.problem_size)))),
          ptr_A(static_cast<ElementA const*>(args.ptr_A)),
          iterator_B(args.problem_size,
                     LayoutB::packed(cutlass::conv::implicit_gemm_tensor_b_extent(kConvolutionalOperator, args.problem_size))),
          ptr_B(static_cast<ElementB const*>(args.ptr_B)) {
      gemm_k_iterations = cutlass::conv::implicit_gemm_k_iterations(kConvolutionalOperator, ThreadblockShape::kK,
                                                                    args.problem_size);
      ThreadblockSwizzle threadblock_swizzle;
      grid_tiled_shape = threadblock_swizzle.get_tiled_shape(
          kConvolutionalOperator, args.problem_size,
          {ThreadblockShape::kM, ThreadblockShape::kN, ThreadblockShape::kK}, 1);
      swizzle_log_tile = threadblock_swizzle.get_log_tile(grid_tiled_shape);
      problem_shape = cute::make_shape(int32_t(grid_tiled_shape.m() * ThreadblockShape::kM),
                                       int32_t(args.problem_size.C), int32_t(1));
      output_op = FusionCallbacks::to_underlying_arguments(
          cutlass::gemm::GemmCoord(cute::get<0>(problem_shape), cute::get<1>(problem_shape),
                                   cutlass::conv::implicit_gemm_problem_size(kConvolutionalOperator, args.problem_size).k()),
          args.epilogue, nullptr /*workspace*/);
    }
  };

  union SharedStorage {
    typename Mma::SharedStorage main_loop;
    typename Epilogue::SharedStorage epilogue;
  };

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

  /// The geometry the row map needs (host).
  static StridedDgradGeometry geometry(ConvProblemSize const& problem_size) {
    StridedDgradGeometry g;
    g.n = problem_size.N;
    g.h = problem_size.H;
    g.w = problem_size.W;
    g.stride_h = problem_size.stride_h;
    g.stride_w = problem_size.stride_w;
    g.pad_h = problem_size.pad_h;
    g.pad_w = problem_size.pad_w;
    g.tile_m_per_filter = cutlass::conv::strided_dgrad_tile_m_per_filter(problem_size, ThreadblockShape::kM);
    g.tile_m = ThreadblockShape::kM;
    return g;
  }

  CUTLASS_HOST_DEVICE
  ImplicitGemmConvolutionStridedDgradWithVisitor() {}

  CUTLASS_DEVICE
  void operator()(Params const& params, SharedStorage& shared_storage) {
    ThreadblockSwizzle threadblock_swizzle;
    cutlass::gemm::GemmCoord threadblock_tile_idx = threadblock_swizzle.get_tile_offset(params.swizzle_log_tile);
    if (params.grid_tiled_shape.m() <= threadblock_tile_idx.m() ||
        params.grid_tiled_shape.n() <= threadblock_tile_idx.n()) {
      return;
    }
    int thread_idx = threadIdx.x;
    int tile_m_per_filter = cutlass::conv::strided_dgrad_tile_m_per_filter(params.problem_size, ThreadblockShape::kM);
    int filter_tile_m = threadblock_tile_idx.m() / tile_m_per_filter;
    int start_r, start_s;
    params.stride_w_divmod(start_r, start_s, filter_tile_m);
    int start_h, start_w;
    cutlass::conv::strided_dgrad_starting_coords(params.problem_size, params.stride_h_divmod, params.stride_w_divmod,
                                                 start_r, start_s, start_h, start_w);
    if (start_h >= params.problem_size.H || start_w >= params.problem_size.W) {
      return;  // this phase has no pixel of dx
    }
    typename Mma::FragmentC accumulators;
    accumulators.clear();
    int warp_idx = cutlass::canonical_warp_idx_sync();
    int lane_idx = threadIdx.x % 32;
    // phases whose first tap lies outside the filter (stride > filter extent) only see zeros
    if (start_r < params.problem_size.R && start_s < params.problem_size.S) {
      int gemm_k_iterations = (params.gemm_k_iterations / (params.problem_size.R * params.problem_size.S)) *
                              params.problem_size.num_gemm_k_filter_positions(start_r, start_s);
      typename Mma::IteratorA iterator_A(params.iterator_A, params.problem_size, params.ptr_A, thread_idx,
                                         params.stride_h_divmod, params.stride_w_divmod, start_r, start_s,
                                         cutlass::MatrixCoord(threadblock_tile_idx.m() * Mma::Shape::kM,
                                                              threadblock_tile_idx.k() * Mma::Shape::kK));
      typename Mma::IteratorB iterator_B(params.iterator_B, params.problem_size, params.ptr_B, thread_idx, start_r,
                                         start_s,
                                         cutlass::MatrixCoord(threadblock_tile_idx.k() * Mma::Shape::kK,
                                                              threadblock_tile_idx.n() * Mma::Shape::kN));
      Mma mma(shared_storage.main_loop, thread_idx, warp_idx, lane_idx);
      mma(gemm_k_iterations, accumulators, iterator_A, iterator_B, accumulators);
    }
    __syncthreads();
    threadblock_tile_idx = threadblock_swizzle.get_tile_offset(params.swizzle_log_tile);
    Epilogue epilogue(params.output_op, shared_storage.epilogue, thread_idx, warp_idx, lane_idx);
    epilogue(accumulators, threadblock_tile_idx, params.problem_shape, thread_idx);
  }
};

// ---- visitors with the strided-dgrad row map ----------------------------------------------------
// Copies of CUTLASS 2.x's (epilogue/threadblock/fusion/visitor_load.hpp, visitor_store.hpp) whose
// global addresses come from the row map instead of the (M, N) layout.

using cutlass::epilogue::threadblock::EmptyCallbacks;

/// An aux load (VisitorAuxLoad) whose rows are dx's pixels.
template <class ThreadMap, class Element, class StrideMNL, bool kFast>
struct StridedDgradAuxLoad {
  struct Arguments {
    Element* ptr_aux = nullptr;
    Element null_default = Element(0);
    StrideMNL dAux = {};
    StridedDgradGeometry geometry = {};
  };
  using Params = Arguments;

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const&, Arguments const& args, void*) {
    return args;
  }
  template <class ProblemShape>
  static size_t get_workspace_size(ProblemShape const&, Arguments const&) {
    return 0;
  }

  static const int Stages = ThreadMap::Stages;
  struct SharedStorage {};
  static int constexpr vec_bits = ThreadMap::kElementsPerAccess * cutlass::sizeof_bits<Element>::value;
  using VecType = cute::uint_bit_t<cute::min(128, vec_bits)>;
  static int constexpr VecLength = sizeof(VecType) / sizeof(Element);

  CUTLASS_HOST_DEVICE StridedDgradAuxLoad() {}
  CUTLASS_HOST_DEVICE StridedDgradAuxLoad(Params const& params, SharedStorage const&) : params_ptr(&params) {}
  Params const* params_ptr;

  template <class RTensor, class CTensor>
  struct Callbacks : EmptyCallbacks {
    CUTLASS_DEVICE Callbacks(RTensor&& tC_rAux, CTensor&& tC_cAux, int n, Params const* params_ptr,
                             StridedDgradRows<kFast> const& rows)
        : tC_rAux(cute::forward<RTensor>(tC_rAux)), tC_cAux(cute::forward<CTensor>(tC_cAux)), n(n),
          params_ptr(params_ptr), rows(rows) {}

    RTensor tC_rAux;  // (VECTOR, FRAGMENT_COLUMN, FRAGMENT_ROW, Stages) of VecType
    CTensor tC_cAux;  // (VECTOR, FRAGMENT_COLUMN, FRAGMENT_ROW, STEPS) coordinates (m, n, l)
    int n;
    Params const* params_ptr;
    StridedDgradRows<kFast> rows;

    CUTLASS_DEVICE void begin_step(int step_idx) {
      using namespace cute;
      auto dst = tC_rAux(_, _, _, step_idx % Stages);
      clear(dst);
      CUTLASS_PRAGMA_UNROLL
      for (int r = 0; r < size<2>(tC_cAux); ++r) {
        int m = get<0>(tC_cAux(0, 0, r, step_idx));
        bool row_ok = rows.valid(m);
        Element const* row_ptr = params_ptr->ptr_aux + (row_ok ? rows.row(m) * int64_t(get<0>(params_ptr->dAux)) : 0);
        CUTLASS_PRAGMA_UNROLL
        for (int c = 0; c < size<1>(tC_cAux); ++c) {
          CUTLASS_PRAGMA_UNROLL
          for (int v = 0; v < size<0>(tC_cAux); ++v) {
            int col = get<1>(tC_cAux(v, c, r, step_idx));
            cutlass::arch::global_load<VecType, sizeof(VecType)>(dst(v, c, r), (void const*)(row_ptr + col),
                                                                 row_ok && col < n);
          }
        }
      }
    }

    template <class ElementAccumulator, int FragmentSize>
    CUTLASS_DEVICE auto visit(int iter_idx, int row_idx, int column_idx, int frg_idx,
                              cutlass::Array<ElementAccumulator, FragmentSize> const& frg_acc) {
      using namespace cute;
      Tensor tC_rAux_frg = recast<cutlass::Array<Element, FragmentSize>>(coalesce(tC_rAux(_, _, _, iter_idx % Stages)));
      return tC_rAux_frg(frg_idx);
    }
  };

  template <class ProblemShape>
  CUTLASS_DEVICE auto get_callbacks(cutlass::gemm::GemmCoord threadblock_tile_offset, int thread_idx,
                                    ProblemShape problem_shape) {
    using namespace cute;
    Tensor mAux = make_tensor(make_gmem_ptr(params_ptr->ptr_aux), problem_shape, params_ptr->dAux);  // (M,N,L)
    Tensor tC_gAux = recast<VecType>(group_modes<3, 6>(ThreadMap::partition(mAux, thread_idx, threadblock_tile_offset)));
    Tensor tC_rAux = make_tensor<VecType>(make_layout(flatten(make_shape(take<0, 3>(tC_gAux.shape()), Int<Stages>{}))));
    Tensor cAux = make_identity_tensor(mAux.shape());
    Tensor tC_cAux = outer_partition(group_modes<3, 6>(ThreadMap::partition(cAux, thread_idx, threadblock_tile_offset)),
                                     Shape<Int<VecLength>>{}, (_0{}));
    return Callbacks<decltype(tC_rAux), decltype(tC_cAux)>(
        cute::move(tC_rAux), cute::move(tC_cAux), int(get<1>(problem_shape)), params_ptr,
        StridedDgradRows<kFast>(params_ptr->geometry, threadblock_tile_offset.m()));
  }
};

/// An aux store (VisitorAuxStore) whose rows are dx's pixels.
template <class ThreadMap, class Element, cutlass::FloatRoundStyle RoundStyle, class StrideMNL, bool kFast>
struct StridedDgradAuxStore {
  struct Arguments {
    Element* ptr_aux = nullptr;
    StrideMNL dAux = {};
    StridedDgradGeometry geometry = {};
  };
  using Params = Arguments;

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const&, Arguments const& args, void*) {
    return args;
  }
  template <class ProblemShape>
  static size_t get_workspace_size(ProblemShape const&, Arguments const&) {
    return 0;
  }

  struct SharedStorage {};
  static int constexpr vec_bits = ThreadMap::kElementsPerAccess * cutlass::sizeof_bits<Element>::value;
  using VecType = cute::uint_bit_t<cute::min(128, vec_bits)>;
  static int constexpr VecLength = sizeof(VecType) / sizeof(Element);

  CUTLASS_HOST_DEVICE StridedDgradAuxStore() {}
  CUTLASS_HOST_DEVICE StridedDgradAuxStore(Params const& params, SharedStorage const&) : params_ptr(&params) {}
  Params const* params_ptr;

  template <class RTensor, class CTensor>
  struct Callbacks : EmptyCallbacks {
    CUTLASS_DEVICE Callbacks(RTensor&& tC_rAux, CTensor&& tC_cAux, int n, Params const* params_ptr,
                             StridedDgradRows<kFast> const& rows)
        : tC_rAux(cute::forward<RTensor>(tC_rAux)), tC_cAux(cute::forward<CTensor>(tC_cAux)), n(n),
          params_ptr(params_ptr), rows(rows) {}

    RTensor tC_rAux;  // (VECTOR, FRAGMENT_COLUMN, FRAGMENT_ROW) of Element
    CTensor tC_cAux;  // (VECTOR, FRAGMENT_COLUMN, FRAGMENT_ROW, STEPS) coordinates
    int n;
    Params const* params_ptr;
    StridedDgradRows<kFast> rows;

    CUTLASS_DEVICE void begin_step(int) { cute::clear(tC_rAux); }

    template <class ElementAccumulator, class ElementInput, int FragmentSize>
    CUTLASS_DEVICE auto visit(int iter_idx, int row_idx, int column_idx, int frg_idx,
                              cutlass::Array<ElementAccumulator, FragmentSize> const& frg_acc,
                              cutlass::Array<ElementInput, FragmentSize> const& frg_input) {
      using namespace cute;
      cutlass::NumericArrayConverter<Element, ElementInput, FragmentSize, RoundStyle> convert_input{};
      Tensor tC_rAux_frg = recast<cutlass::Array<Element, FragmentSize>>(coalesce(tC_rAux));
      tC_rAux_frg(frg_idx) = convert_input(frg_input);
      return frg_input;
    }

    CUTLASS_DEVICE void end_step(int step_idx) {
      using namespace cute;
      Tensor src = recast<VecType>(tC_rAux);
      CUTLASS_PRAGMA_UNROLL
      for (int r = 0; r < size<2>(tC_cAux); ++r) {
        int m = get<0>(tC_cAux(0, 0, r, step_idx));
        bool row_ok = rows.valid(m);
        Element* row_ptr = params_ptr->ptr_aux + (row_ok ? rows.row(m) * int64_t(get<0>(params_ptr->dAux)) : 0);
        CUTLASS_PRAGMA_UNROLL
        for (int c = 0; c < size<1>(tC_cAux); ++c) {
          CUTLASS_PRAGMA_UNROLL
          for (int v = 0; v < size<0>(tC_cAux); ++v) {
            int col = get<1>(tC_cAux(v, c, r, step_idx));
            cutlass::arch::global_store<VecType, sizeof(VecType)>(src(v, c, r), (void*)(row_ptr + col),
                                                                  row_ok && col < n);
          }
        }
      }
    }
  };

  template <class ProblemShape>
  CUTLASS_DEVICE auto get_callbacks(cutlass::gemm::GemmCoord threadblock_tile_offset, int thread_idx,
                                    ProblemShape problem_shape) {
    using namespace cute;
    Tensor mAux = make_tensor(make_gmem_ptr(params_ptr->ptr_aux), problem_shape, params_ptr->dAux);  // (M,N,L)
    Tensor tC_gAux = group_modes<3, 6>(ThreadMap::partition(mAux, thread_idx, threadblock_tile_offset));
    Tensor tC_rAux = make_tensor_like(take<0, 3>(tC_gAux));
    Tensor cAux = make_identity_tensor(mAux.shape());
    Tensor tC_cAux = outer_partition(group_modes<3, 6>(ThreadMap::partition(cAux, thread_idx, threadblock_tile_offset)),
                                     Shape<Int<VecLength>>{}, (_0{}));
    return Callbacks<decltype(tC_rAux), decltype(tC_cAux)>(
        cute::move(tC_rAux), cute::move(tC_cAux), int(get<1>(problem_shape)), params_ptr,
        StridedDgradRows<kFast>(params_ptr->geometry, threadblock_tile_offset.m()));
  }
};

/// A column broadcast (VisitorColBroadcast: one value per row) whose rows are dx's pixels.
template <class ThreadMap, class Element, class StrideMNL, bool kFast>
struct StridedDgradColBroadcast {
  struct Arguments {
    Element const* ptr_col = nullptr;
    Element null_default = Element(0);
    StrideMNL dCol = {};
    StridedDgradGeometry geometry = {};
  };
  using Params = Arguments;

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const&, Arguments const& args, void*) {
    return args;
  }
  template <class ProblemShape>
  static size_t get_workspace_size(ProblemShape const&, Arguments const&) {
    return 0;
  }
  struct SharedStorage {};

  CUTLASS_HOST_DEVICE StridedDgradColBroadcast() {}
  CUTLASS_HOST_DEVICE StridedDgradColBroadcast(Params const& params, SharedStorage const&) : params_ptr(&params) {}
  Params const* params_ptr;

  template <class RTensor, class CTensor>
  struct Callbacks : EmptyCallbacks {
    CUTLASS_DEVICE Callbacks(RTensor&& tC_rCol, CTensor&& tC_cCol, Params const* params_ptr,
                             StridedDgradRows<kFast> const& rows)
        : tC_rCol(cute::forward<RTensor>(tC_rCol)), tC_cCol(cute::forward<CTensor>(tC_cCol)), params_ptr(params_ptr),
          rows(rows) {}

    RTensor tC_rCol;  // (FRAGMENT_ROW, STEPS) values
    CTensor tC_cCol;  // (FRAGMENT_ROW, STEPS) coordinates
    Params const* params_ptr;
    StridedDgradRows<kFast> rows;

    CUTLASS_DEVICE void begin_epilogue() {
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < cute::size(tC_cCol); ++i) {
        int m = cute::get<0>(tC_cCol(i));
        tC_rCol(i) = rows.valid(m) ? params_ptr->ptr_col[rows.row(m) * int64_t(cute::get<0>(params_ptr->dCol))]
                                   : Element(0);
      }
    }

    template <class ElementAccumulator, int FragmentSize>
    CUTLASS_DEVICE auto visit(int iter_idx, int row_idx, int column_idx, int frg_idx,
                              cutlass::Array<ElementAccumulator, FragmentSize> const& frg_acc) {
      cutlass::Array<Element, FragmentSize> frg_col;
      frg_col.fill(tC_rCol(row_idx, iter_idx));
      return frg_col;
    }
  };

  template <class ProblemShape>
  CUTLASS_DEVICE auto get_callbacks(cutlass::gemm::GemmCoord threadblock_tile_offset, int thread_idx,
                                    ProblemShape problem_shape) {
    using namespace cute;
    Tensor mCol = make_tensor(make_gmem_ptr(params_ptr->ptr_col), problem_shape, params_ptr->dCol);
    Tensor cCol = make_identity_tensor(mCol.shape());
    Tensor tC_cCol = group_modes<1, 4>(ThreadMap::partition(cCol, thread_idx, threadblock_tile_offset)(_0{}, _0{}, _, _, _, _));
    Tensor tC_rCol = make_tensor<Element>(make_layout(tC_cCol.shape()));
    return Callbacks<decltype(tC_rCol), decltype(tC_cCol)>(
        cute::move(tC_rCol), cute::move(tC_cCol), params_ptr,
        StridedDgradRows<kFast>(params_ptr->geometry, threadblock_tile_offset.m()));
  }
};

/// A row reduction (CUTLASS's VisitorColReduction: over N, one value per row) whose rows are dx's
/// pixels: the warp's partial row results go to the pixel's element, by atomics.
template <template <class> class RegReduceFn, template <class> class AtomicReduceFn, class ThreadMap,
          class ElementOutput, class ElementCompute, cutlass::FloatRoundStyle RoundStyle, class StrideMNL, bool kFast>
struct StridedDgradColReduction {
  struct Arguments {
    ElementOutput* ptr_col = nullptr;
    ElementCompute reduction_identity = 0;
    StrideMNL dCol = {};
    StridedDgradGeometry geometry = {};
  };
  using Params = Arguments;

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const&, Arguments const& args, void*) {
    return args;
  }
  template <class ProblemShape>
  static size_t get_workspace_size(ProblemShape const&, Arguments const&) {
    return 0;
  }
  struct SharedStorage {};

  CUTLASS_HOST_DEVICE StridedDgradColReduction() {}
  CUTLASS_HOST_DEVICE StridedDgradColReduction(Params const& params, SharedStorage const&) : params_ptr(&params) {}
  Params const* params_ptr;

  template <class CTensor>
  struct Callbacks : EmptyCallbacks {
    CUTLASS_DEVICE Callbacks(CTensor&& tC_cCol, int n, Params const* params_ptr, int thread_idx,
                             StridedDgradRows<kFast> const& rows)
        : tC_cCol(cute::forward<CTensor>(tC_cCol)), n(n), params_ptr(params_ptr), rows(rows) {
      is_writing_thread = thread_idx % ThreadMap::Detail::kAccessWidth == 0;
    }

    CTensor tC_cCol;  // (FRAGMENT_COLUMN, FRAGMENT_ROW, STEPS) coordinates
    int n;
    Params const* params_ptr;
    StridedDgradRows<kFast> rows;
    int curr_iter_idx = 0;
    bool is_writing_thread;
    ElementCompute reduction_accum;

    CUTLASS_DEVICE void begin_row(int) { reduction_accum = ElementCompute(params_ptr->reduction_identity); }

    template <class ElementAccumulator, class ElementInput, int FragmentSize>
    CUTLASS_DEVICE auto visit(int iter_idx, int row_idx, int column_idx, int frg_idx,
                              cutlass::Array<ElementAccumulator, FragmentSize> const& frg_acc,
                              cutlass::Array<ElementInput, FragmentSize> const& frg_input) {
      curr_iter_idx = iter_idx;
      int coord_n = cute::get<1>(tC_cCol(column_idx, row_idx, iter_idx));
      if (coord_n < n) {
        cutlass::epilogue::threadblock::fragment_reduce<RegReduceFn, RoundStyle>(reduction_accum, frg_input);
      }
      if (column_idx + 1 == ThreadMap::Iterations::kColumn) {
        cutlass::epilogue::threadblock::intra_warp_row_reduce<RegReduceFn, ThreadMap::Detail::kAccessWidth>(
            reduction_accum);
      }
      return frg_input;
    }

    CUTLASS_DEVICE void end_row(int row_idx) {
      int m = cute::get<0>(tC_cCol(cute::_0{}, row_idx, curr_iter_idx));
      if (is_writing_thread && rows.valid(m)) {
        ElementOutput* target = params_ptr->ptr_col + rows.row(m) * int64_t(cute::get<0>(params_ptr->dCol));
        cutlass::epilogue::threadblock::atomic_reduce<AtomicReduceFn, RoundStyle>(target, reduction_accum);
      }
    }
  };

  template <class ProblemShape>
  CUTLASS_DEVICE auto get_callbacks(cutlass::gemm::GemmCoord threadblock_tile_offset, int thread_idx,
                                    ProblemShape problem_shape) {
    using namespace cute;
    Tensor cCol = make_identity_tensor(problem_shape);
    Tensor tC_cCol = group_modes<2, 5>(ThreadMap::partition(cCol, thread_idx, threadblock_tile_offset)(_0{}, _, _, _, _, _));
    return Callbacks<decltype(tC_cCol)>(cute::move(tC_cCol), int(get<1>(problem_shape)), params_ptr, thread_idx,
                                        StridedDgradRows<kFast>(params_ptr->geometry, threadblock_tile_offset.m()));
  }
};

/// A reduction over M (CUTLASS's VisitorRowReduction, VisitorScalarReduction) that sees the
/// reduction's identity in the rows that are no pixel of dx (NOTE [Strided dgrad rows]; no
/// division: a pixel's row is below the phase's first row plus its pixel count).
template <class Base, class ThreadMap>
struct StridedDgradMasked : Base {
  struct Arguments {
    typename Base::Arguments base;
    StridedDgradGeometry geometry = {};
  };
  struct Params {
    typename Base::Params base;
    StridedDgradGeometry geometry = {};
  };
  using SharedStorage = typename Base::SharedStorage;

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const& problem_shape, Arguments const& args,
                                                  void* workspace) {
    return Params{Base::to_underlying_arguments(problem_shape, args.base, workspace), args.geometry};
  }
  template <class ProblemShape>
  static size_t get_workspace_size(ProblemShape const& problem_shape, Arguments const& args) {
    return Base::get_workspace_size(problem_shape, args.base);
  }

  CUTLASS_HOST_DEVICE StridedDgradMasked() {}
  CUTLASS_HOST_DEVICE StridedDgradMasked(Params const& params, SharedStorage const& shared_storage)
      : Base(params.base, shared_storage), geometry_ptr(&params.geometry) {}
  StridedDgradGeometry const* geometry_ptr;

  template <class BaseCallbacks, class CTensor>
  struct Callbacks : BaseCallbacks {
    CUTLASS_DEVICE Callbacks(BaseCallbacks&& base, CTensor&& tC_c, StridedDgradRows<false> const& rows)
        : BaseCallbacks(cute::forward<BaseCallbacks>(base)), tC_c(cute::forward<CTensor>(tC_c)), rows(rows) {}

    CTensor tC_c;  // (FRAGMENT_COLUMN, FRAGMENT_ROW, STEPS) coordinates
    StridedDgradRows<false> rows;  // only valid() is used: no division

    template <class ElementAccumulator, class ElementInput, int FragmentSize>
    CUTLASS_DEVICE auto visit(int iter_idx, int row_idx, int column_idx, int frg_idx,
                              cutlass::Array<ElementAccumulator, FragmentSize> const& frg_acc,
                              cutlass::Array<ElementInput, FragmentSize> const& frg_input) {
      if (rows.valid(cute::get<0>(tC_c(column_idx, row_idx, iter_idx)))) {
        return BaseCallbacks::visit(iter_idx, row_idx, column_idx, frg_idx, frg_acc, frg_input);
      }
      cutlass::Array<ElementInput, FragmentSize> identity;
      identity.fill(ElementInput(this->params_ptr->reduction_identity));
      BaseCallbacks::visit(iter_idx, row_idx, column_idx, frg_idx, frg_acc, identity);
      return frg_input;
    }
  };

  template <class ProblemShape>
  CUTLASS_DEVICE auto get_callbacks(cutlass::gemm::GemmCoord threadblock_tile_offset, int thread_idx,
                                    ProblemShape problem_shape) {
    using namespace cute;
    auto base = Base::get_callbacks(threadblock_tile_offset, thread_idx, problem_shape);
    Tensor c = make_identity_tensor(problem_shape);
    Tensor tC_c = group_modes<2, 5>(ThreadMap::partition(c, thread_idx, threadblock_tile_offset)(_0{}, _, _, _, _, _));
    return Callbacks<decltype(base), decltype(tC_c)>(cute::move(base), cute::move(tC_c),
                                                     StridedDgradRows<false>(*geometry_ptr, threadblock_tile_offset.m()));
  }
};

}  // namespace conv
}  // namespace evtc
