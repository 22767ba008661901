// evtc's sm90 row and column reductions: CUTLASS's Sm90ColReduction / Sm90RowReduction with a
// parallel final reduction across tiles (evtc::Sm90ColReductionParallel, Sm90RowReductionParallel),
// and their atomic forms with a fill that spares the gaps between batches
// (evtc::Sm90ColReductionAtomic, Sm90RowReductionAtomic).
// #included (after sm90_visitors.hpp) only by the emitted sm90 kernels with a row or column
// reduction, so that the other kernels' build-cache keys don't depend on it.
#pragma once

#include <cstring>

#include <cuda.h>
#include <cuda_runtime.h>

#include <cutlass/epilogue/fusion/sm90_visitor_store_tma_warpspecialized.hpp>

#include <evtc/driver_entry.hpp>

namespace evtc {

// Row and column reductions with a parallel final reduction across tiles.
//
// CUTLASS's Sm90ColReduction (evtc's row reduction: one value per row) and Sm90RowReduction
// (evtc's column reduction) with FinalReduction: every CTA writes its tile's partials (one float
// per row, resp. column, of the tile) to a workspace, __threadfence()s, bumps a counter per row
// (column) of tiles, and the CTA that bumps it last reduces the partials of all tiles (and
// batches) in ConsumerStoreCallbacks::end(). There, the base gives each thread one row and reads
// that row's partials one after another: one dependent L2 round trip per tile, so at decode
// shapes (N / tile_N = 224 tiles at N = 28672) the last CTA waits ~224 serial L2 latencies.
//
// Sm90ColReductionParallel / Sm90RowReductionParallel are the base visitors (same template
// arguments, Params, Arguments, workspace and the per-tile reduce()) with only end() replaced:
// a warp takes RowsPerWarp rows at a time (lane % RowsPerWarp; consecutive rows are consecutive
// in the workspace), the LanesPerRow lanes of a row stride over its partials with Unroll
// independent accumulators each (Unroll loads in flight per lane), and the lanes of a row meet
// by warp shuffles. Rows the residue marks out of the problem are neither stored (as in the base)
// nor read (the base reads and drops them). Loads are volatile (L2, as the base's workspace
// stores), after an acquire fence (fence.acq_rel.gpu, lighter than __threadfence()'s fence.sc)
// that orders them after the counter the last CTA observed (the base has none; its writers
// __threadfence() before bumping the counter).
// Max and min give exactly the base's results; sums associate differently from the base (a
// fixed order, so still deterministic).
// ---------------------------------------------------------------------------------------------

namespace detail {

// The reader's side of the workspace handshake: thread 0's atomicAdd saw every other tile's
// count, and the CTA barrier after it orders this thread after that atomic.
CUTLASS_DEVICE void acquire_fence() {
  asm volatile("fence.acq_rel.gpu;\n" ::: "memory");
}

// Reduces, for each of the Rows rows of a tile with valid(row), the partials
// row_buf(row, l)(i) for l < batches and i < count with ReduceFn and calls store(row, result).
// row_buf(row, l) is a rank-1 tensor (one batch's partials of the row: no index division in the
// loop). All NumThreads threads (whole warps, thread_idx within the epilogue's threads) call it
// together.
template <int NumThreads, int Rows, template <class> class ReduceFn, class Element,
          class RowBuf, class Valid, class Store>
CUTLASS_DEVICE void
parallel_final_reduction(int thread_idx, int batches, int count, Element identity,
                         RowBuf const& row_buf, Valid const& valid, Store const& store) {
  constexpr int Lanes = 32;
  constexpr int RowsPerWarp = 4;                    // rows one warp reduces at a time
  constexpr int LanesPerRow = Lanes / RowsPerWarp;  // lanes splitting one row's partials
  constexpr int Unroll = 8;                         // independent accumulators (loads in flight) per lane
  constexpr int Warps = NumThreads / Lanes;
  constexpr int Groups = (Rows + RowsPerWarp - 1) / RowsPerWarp;
  static_assert(NumThreads % Lanes == 0, "the epilogue's threads are whole warps");
  static_assert(sizeof(Element) == 4, "the partials are 32-bit (float)");

  ReduceFn<Element> reduce{};
  int const lane = thread_idx % Lanes;
  int const warp = thread_idx / Lanes;
  int const lane_row = lane % RowsPerWarp;
  int const lane_part = lane / RowsPerWarp;

  CUTLASS_PRAGMA_NO_UNROLL
  for (int g = warp; g < Groups; g += Warps) {  // warp-uniform
    int const row = g * RowsPerWarp + lane_row;
    bool const in_tile = row < Rows;
    bool const do_store = in_tile && valid(row);
    if (not __any_sync(0xFFFFFFFFu, do_store)) {  // no row of this group is in the problem
      continue;
    }

    Element acc[Unroll];
    CUTLASS_PRAGMA_UNROLL
    for (int u = 0; u < Unroll; ++u) {
      acc[u] = identity;
    }
    CUTLASS_PRAGMA_NO_UNROLL
    for (int l = 0; in_tile && l < batches; ++l) {
      auto buf = row_buf(row, l);
      CUTLASS_PRAGMA_NO_UNROLL
      for (int i0 = lane_part; i0 < count; i0 += LanesPerRow * Unroll) {
        Element v[Unroll];
        CUTLASS_PRAGMA_UNROLL
        for (int u = 0; u < Unroll; ++u) {
          int const i = i0 + u * LanesPerRow;
          v[u] = i < count ? *static_cast<Element const volatile*>(&buf(i)) : identity;
        }
        CUTLASS_PRAGMA_UNROLL
        for (int u = 0; u < Unroll; ++u) {
          acc[u] = reduce(acc[u], v[u]);
        }
      }
    }
    CUTLASS_PRAGMA_UNROLL
    for (int s = Unroll / 2; s > 0; s /= 2) {
      CUTLASS_PRAGMA_UNROLL
      for (int u = 0; u < s; ++u) {
        acc[u] = reduce(acc[u], acc[u + s]);
      }
    }
    Element out = acc[0];
    CUTLASS_PRAGMA_UNROLL
    for (int offset = Lanes / 2; offset >= RowsPerWarp; offset /= 2) {
      out = reduce(out, __shfl_xor_sync(0xFFFFFFFFu, out, offset));
    }
    if (lane_part == 0 && do_store) {
      store(row, out);
    }
  }
}

// The final reduction of Sm90ColReduction (Axis = 0: one value per row m) or Sm90RowReduction (Axis = 1:
// one value per column n) with FinalReduction = true, run by the CTA that found the tile counter complete.
// args_tuple is the base's (get_consumer_store_callbacks): get<3> the output (CTA_M,CTA_N,L), get<4> its
// coordinates, get<5> the workspace partials (CTA_M,CTA_N,REST,L), get<12> the residue, get<15> the tiled
// copy, get<16> the thread index. Both of the base's branches: reduced over batches (the output's batch
// stride is 0) or one output per batch.
template <int Axis, template <class> class GmemReduceFn, class ElementOutput, class ElementCompute,
          cutlass::FloatRoundStyle RoundStyle, class ArgsTuple, class Params>
CUTLASS_DEVICE void
parallel_end(ArgsTuple& args_tuple, Params const& params) {
  using namespace cute;
  auto&& gOut_l = get<3>(args_tuple);
  auto&& cOut = get<4>(args_tuple);
  auto&& gBuf = get<5>(args_tuple);
  auto&& residue = get<12>(args_tuple);
  int thread_idx = get<16>(args_tuple);
  constexpr int NumThreads = decltype(size(get<15>(args_tuple)))::value;  // the tiled copy's threads
  constexpr int Count = decltype(size<Axis>(gBuf))::value;                // rows (Axis 0) or columns (1)

  // the (m, 0) or (0, n) coordinate of entry i along the reduced vector
  auto at = [](auto&& t, int i, auto... rest) -> decltype(auto) {
    if constexpr (Axis == 0) {
      return t(i, _0{}, rest...);
    } else {
      return t(_0{}, i, rest...);
    }
  };

  // Order the workspace reads after the tile counter this CTA found complete.
  acquire_fence();

  cutlass::NumericConverter<ElementOutput, ElementCompute, RoundStyle> convert_output{};
  auto valid = [&](int i) { return elem_less(at(cOut, i), residue); };

  if (size<2>(stride(gOut_l)) == 0) {  // reduction over batches
    parallel_final_reduction<NumThreads, Count, GmemReduceFn>(
        thread_idx, int(size<3>(gBuf)), int(size<2>(gBuf)), params.reduction_identity,
        [&](int i, int l) { return at(gBuf, i, _, l); }, valid,
        [&](int i, ElementCompute out) { at(gOut_l, i, _0{}) = convert_output(out); });
  }
  else {  // one output per batch
    CUTLASS_PRAGMA_NO_UNROLL
    for (int l = 0; l < size<3>(gBuf); ++l) {
      parallel_final_reduction<NumThreads, Count, GmemReduceFn>(
          thread_idx, 1, int(size<2>(gBuf)), params.reduction_identity,
          [&](int i, int) { return at(gBuf, i, _, l); }, valid,
          [&](int i, ElementCompute out) { at(gOut_l, i, l) = convert_output(out); });
    }
  }
}

}  // namespace detail

// evtc's row reduction: Sm90ColReduction<..., FinalReduction = true> with a parallel end().
template <
  template <class> class RegReduceFn,
  template <class> class ShuffleReduceFn,
  template <class> class GmemReduceFn,
  int Stages,
  class CtaTileShapeMNK,
  class ElementOutput,
  class ElementCompute,
  cutlass::FloatRoundStyle RoundStyle,
  class StrideMNL = cute::Stride<cute::_1, cute::_0, cute::_0>,
  int Alignment = 128 / cutlass::sizeof_bits_v<ElementOutput>,
  bool EnableNullptr = true,
  bool VisitCheckOOB = true
>
struct Sm90ColReductionParallel
    : cutlass::epilogue::fusion::Sm90ColReduction<
        RegReduceFn, ShuffleReduceFn, GmemReduceFn, Stages, CtaTileShapeMNK, ElementOutput, ElementCompute,
        RoundStyle, StrideMNL, Alignment, EnableNullptr, /*FinalReduction=*/true, VisitCheckOOB> {
  using Base = cutlass::epilogue::fusion::Sm90ColReduction<
      RegReduceFn, ShuffleReduceFn, GmemReduceFn, Stages, CtaTileShapeMNK, ElementOutput, ElementCompute,
      RoundStyle, StrideMNL, Alignment, EnableNullptr, true, VisitCheckOOB>;
  using Base::Base;
  static_assert(not cutlass::is_atomic<GmemReduceFn<ElementCompute>>::value,
                "the parallel final reduction replaces the workspace reduction, not the atomic one");

  template <class ArgsTuple>
  struct ConsumerStoreCallbacks : Base::template ConsumerStoreCallbacks<ArgsTuple> {
    using Callbacks = typename Base::template ConsumerStoreCallbacks<ArgsTuple>;
    using Callbacks::Callbacks;

    CUTLASS_DEVICE void
    end() {
      if (this->do_final_reduction) {
        detail::parallel_end<0, GmemReduceFn, ElementOutput, ElementCompute, RoundStyle>(this->args_tuple, this->params);
      }
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto
  get_consumer_store_callbacks(cutlass::epilogue::fusion::detail::ConsumerStoreArgs<Args...> const& args) {
    auto base = Base::template get_consumer_store_callbacks<ReferenceSrc>(args);
    using ArgsTuple = decltype(base.args_tuple);
    return ConsumerStoreCallbacks<ArgsTuple>(cute::move(base.args_tuple), this->params);
  }
};

// evtc's column reduction: Sm90RowReduction<..., FinalReduction = true> with a parallel end().
template <
  template <class> class RegReduceFn,
  template <class> class ShuffleReduceFn,
  template <class> class GmemReduceFn,
  int Stages,
  class CtaTileShapeMNK,
  class ElementOutput,
  class ElementCompute,
  cutlass::FloatRoundStyle RoundStyle,
  class StrideMNL = cute::Stride<cute::_0, cute::_1, cute::_0>,
  int Alignment = 128 / cutlass::sizeof_bits_v<ElementOutput>,
  bool EnableNullptr = true,
  bool VisitCheckOOB = true
>
struct Sm90RowReductionParallel
    : cutlass::epilogue::fusion::Sm90RowReduction<
        RegReduceFn, ShuffleReduceFn, GmemReduceFn, Stages, CtaTileShapeMNK, ElementOutput, ElementCompute,
        RoundStyle, StrideMNL, Alignment, EnableNullptr, /*FinalReduction=*/true, VisitCheckOOB> {
  using Base = cutlass::epilogue::fusion::Sm90RowReduction<
      RegReduceFn, ShuffleReduceFn, GmemReduceFn, Stages, CtaTileShapeMNK, ElementOutput, ElementCompute,
      RoundStyle, StrideMNL, Alignment, EnableNullptr, true, VisitCheckOOB>;
  using Base::Base;
  static_assert(not cutlass::is_atomic<GmemReduceFn<ElementCompute>>::value,
                "the parallel final reduction replaces the workspace reduction, not the atomic one");

  template <class ArgsTuple>
  struct ConsumerStoreCallbacks : Base::template ConsumerStoreCallbacks<ArgsTuple> {
    using Callbacks = typename Base::template ConsumerStoreCallbacks<ArgsTuple>;
    using Callbacks::Callbacks;

    CUTLASS_DEVICE void
    end() {
      if (this->do_final_reduction) {
        detail::parallel_end<1, GmemReduceFn, ElementOutput, ElementCompute, RoundStyle>(this->args_tuple, this->params);
      }
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto
  get_consumer_store_callbacks(cutlass::epilogue::fusion::detail::ConsumerStoreArgs<Args...> const& args) {
    auto base = Base::template get_consumer_store_callbacks<ReferenceSrc>(args);
    using ArgsTuple = decltype(base.args_tuple);
    return ConsumerStoreCallbacks<ArgsTuple>(cute::move(base.args_tuple), this->params);
  }
};

// Atomic row and column max/min (NOTE [Atomic row and column max], evtc/plan/sm90.py): CUTLASS's
// Sm90ColReduction / Sm90RowReduction with an atomic GmemReduceFn, whose initialize_workspace fills
// the output with the identity by cosize(layout) consecutive elements from its base. For a batched
// output whose batch stride exceeds its length (rows padded to 16 bytes, or a caller's strided
// view) that also writes the gaps between batches, which are not the output's. These fill
// exactly the L x length elements, as one pitched memset (cuMemsetD2D32Async, resolved through
// evtc/driver_entry.hpp, so no -lcuda), on the stream.
namespace detail {

template <class Element>
cutlass::Status fill_batched(void* ptr, Element identity, int64_t length, int64_t batches, int64_t batch_stride,
                             cudaStream_t stream) {
  static_assert(sizeof(Element) == 4, "the atomic reductions' outputs are 32-bit (float)");
  if (ptr == nullptr || length <= 0 || batches <= 0) {
    return cutlass::Status::kSuccess;
  }
  if (batch_stride == 0) {  // reduced over batches: one vector
    batches = 1;
  }
  if (batches > 1 && batch_stride < length) {
    return cutlass::Status::kErrorInvalidProblem;  // overlapping batches: the binder refuses these first
  }
  using Fn = CUresult(CUDAAPI*)(CUdeviceptr, size_t, unsigned int, size_t, size_t, CUstream);
  static Fn fn = driver_entry<Fn>("cuMemsetD2D32Async", 3020);
  if (fn == nullptr) {
    return cutlass::Status::kErrorInternal;
  }
  unsigned int bits;
  std::memcpy(&bits, &identity, sizeof(bits));
  size_t const pitch = size_t(batches > 1 ? batch_stride : length) * sizeof(Element);
  return fn(reinterpret_cast<CUdeviceptr>(ptr), pitch, bits, size_t(length), size_t(batches), stream) == CUDA_SUCCESS
             ? cutlass::Status::kSuccess
             : cutlass::Status::kErrorInternal;
}

// An atomic reduction visitor (Base: CUTLASS's, FinalReduction with an atomic GmemReduceFn) with
// fill_batched as its initialize_workspace. Axis 0: evtc's row reduction (Sm90ColReduction:
// ptr_col, dCol, M values per batch); Axis 1: the column reduction (Sm90RowReduction: ptr_row,
// dRow, N values).
template <class Base, int Axis, class ElementOutput, bool Atomic>
struct AtomicBatchedFill : Base {
  static_assert(Atomic, "an atomic reduction: its GmemReduceFn is an atomic functor");
  using Base::Base;
  using typename Base::Arguments;

  template <class ProblemShape>
  static cutlass::Status
  initialize_workspace(ProblemShape const& problem_shape, Arguments const& args, void*, cudaStream_t stream,
                       cutlass::CudaHostAdapter* = nullptr) {
    auto [M, N, K, L] = cute::append<4>(problem_shape, 1);
    ElementOutput const identity(args.reduction_identity);
    if constexpr (Axis == 0) {
      return fill_batched(args.ptr_col, identity, int64_t(M), int64_t(L), int64_t(cute::get<2>(args.dCol)), stream);
    } else {
      return fill_batched(args.ptr_row, identity, int64_t(N), int64_t(L), int64_t(cute::get<2>(args.dRow)), stream);
    }
  }
};

}  // namespace detail

// evtc's atomic row reduction (a row max/min into f32): Sm90ColReduction<atomic> with a batched fill.
template <
  template <class> class RegReduceFn,
  template <class> class ShuffleReduceFn,
  template <class> class GmemReduceFn,
  int Stages,
  class CtaTileShapeMNK,
  class ElementOutput,
  class ElementCompute,
  cutlass::FloatRoundStyle RoundStyle,
  class StrideMNL = cute::Stride<cute::_1, cute::_0, cute::_0>,
  int Alignment = 128 / cutlass::sizeof_bits_v<ElementOutput>,
  bool EnableNullptr = true,
  bool VisitCheckOOB = true
>
using Sm90ColReductionAtomic = detail::AtomicBatchedFill<
    cutlass::epilogue::fusion::Sm90ColReduction<
        RegReduceFn, ShuffleReduceFn, GmemReduceFn, Stages, CtaTileShapeMNK, ElementOutput, ElementCompute,
        RoundStyle, StrideMNL, Alignment, EnableNullptr, /*FinalReduction=*/true, VisitCheckOOB>,
    0, ElementOutput, cutlass::is_atomic<GmemReduceFn<ElementCompute>>::value>;

// evtc's atomic column reduction (a column max/min into f32): Sm90RowReduction<atomic> with a batched fill.
template <
  template <class> class RegReduceFn,
  template <class> class ShuffleReduceFn,
  template <class> class GmemReduceFn,
  int Stages,
  class CtaTileShapeMNK,
  class ElementOutput,
  class ElementCompute,
  cutlass::FloatRoundStyle RoundStyle,
  class StrideMNL = cute::Stride<cute::_0, cute::_1, cute::_0>,
  int Alignment = 128 / cutlass::sizeof_bits_v<ElementOutput>,
  bool EnableNullptr = true,
  bool VisitCheckOOB = true
>
using Sm90RowReductionAtomic = detail::AtomicBatchedFill<
    cutlass::epilogue::fusion::Sm90RowReduction<
        RegReduceFn, ShuffleReduceFn, GmemReduceFn, Stages, CtaTileShapeMNK, ElementOutput, ElementCompute,
        RoundStyle, StrideMNL, Alignment, EnableNullptr, /*FinalReduction=*/true, VisitCheckOOB>,
    1, ElementOutput, cutlass::is_atomic<GmemReduceFn<ElementCompute>>::value>;

}  // namespace evtc
