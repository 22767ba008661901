// evtc's own sm90 visitor nodes (the Sm90 EVT node interface of
// cutlass/epilogue/fusion/sm90_visitor_tma_warpspecialized.hpp). #included by every emitted sm90 kernel.
#pragma once

#include <cutlass/epilogue/fusion/sm90_visitor_tma_warpspecialized.hpp>

namespace evtc {

// NOTE [The members every evtc node shares]: Sm90VisitorImpl
// (cutlass/epilogue/fusion/sm90_visitor_impl.hpp) asks each node of the tree for its workspace
// (get_workspace_size, initialize_workspace) and whether the producer warp loads for it
// (is_producer_load_needed, is_C_load_needed, get_producer_load_callbacks). evtc's own nodes load
// and store from the consumer threads and keep no workspace, so they all answer alike: each
// derives from Sm90ConsumerNode and defines only what differs (Arguments, Params,
// to_underlying_arguments, can_implement, the consumer's callbacks).
struct Sm90ConsumerNode {
  template <class ProblemShape, class Arguments>
  static size_t get_workspace_size(ProblemShape const&, Arguments const&) {
    return 0;
  }

  template <class ProblemShape, class Arguments>
  static cutlass::Status initialize_workspace(ProblemShape const&, Arguments const&, void*, cudaStream_t,
                                              cutlass::CudaHostAdapter* = nullptr) {
    return cutlass::Status::kSuccess;
  }

  CUTLASS_DEVICE bool is_producer_load_needed() const { return false; }
  CUTLASS_DEVICE bool is_C_load_needed() const { return false; }

  template <class... Args>
  CUTLASS_DEVICE auto get_producer_load_callbacks(cutlass::epilogue::fusion::detail::ProducerLoadArgs<Args...> const&) {
    return cutlass::epilogue::fusion::detail::EmptyProducerLoadCallbacks{};
  }
};

// A compile-time constant: returns a fragment filled with the float whose bit pattern is Bits.
// (C++17 has no float template parameters; the bits keep the value exact and the kernel
// folds it into its instructions.)
template <uint32_t Bits>
struct Sm90Immediate : cutlass::epilogue::fusion::Sm90VisitorImpl<> {
  using cutlass::epilogue::fusion::Sm90VisitorImpl<>::Sm90VisitorImpl;

  struct ConsumerStoreCallbacks : cutlass::epilogue::fusion::detail::EmptyConsumerStoreCallbacks {
    template <typename ElementAccumulator, int FragmentSize>
    CUTLASS_DEVICE cutlass::Array<float, FragmentSize>
    visit(cutlass::Array<ElementAccumulator, FragmentSize> const&, int, int, int) {
      cutlass::Array<float, FragmentSize> r;
      r.fill(__uint_as_float(Bits));
      return r;
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto
  get_consumer_store_callbacks(cutlass::epilogue::fusion::detail::ConsumerStoreArgs<Args...> const&) {
    return ConsumerStoreCallbacks{};
  }
};

}  // namespace evtc

namespace evtc {

// One shared-memory buffer for an aux load and an aux store (evtc planner, NOTE [Aux buffer
// sharing] in evtc/plan/sm90.py).
//
// Stock CUTLASS gives every TMA aux store its own StagesD-deep buffer. With ReuseSmemC, the
// collective releases a load-pipeline slot only after the TMA store issued from that slot's
// iteration has completed, and the store of subtile i uses slot i % StagesC, exactly the slot
// the loads of subtile i used. So an aux store may write its subtile into the slot an aux load of
// the same element type has just been read from (each warp's ldmatrix reads and stmatrix writes
// touch the same smem block in program order, as for C/D reuse), and its TMA store, committed in
// the same bulk group as D's, completes before the slot is refilled.
//
// Sm90SharedAuxStore<Store> is Store (a Sm90AuxStore with Stages == StagesC) without its own
// shared storage; Sm90SmemShare<Root, SharePair<LoadPath, StorePath>...> wraps the fusion root
// and, after constructing the tree, points each sharing store at its load's buffer. A path is the
// sequence of indices into the nested `ops` tuples (Sm90VisitorImplBase::ops) from the root.
// ---------------------------------------------------------------------------------------------

template <class Store>
struct Sm90SharedAuxStore : Store {
  struct SharedStorage {};

  CUTLASS_HOST_DEVICE Sm90SharedAuxStore() {}

  CUTLASS_HOST_DEVICE
  Sm90SharedAuxStore(typename Store::Params const& params, SharedStorage const& shared_storage)
      // The base only takes the address of its buffer; the share wrapper repoints it.
      : Store(params, *reinterpret_cast<typename Store::SharedStorage const*>(&shared_storage)) {}
};

template <class LoadPath, class StorePath>
struct SharePair {};

namespace detail {

template <class Visitor>
CUTLASS_DEVICE auto& at_path(Visitor& v, cute::seq<>) { return v; }

template <class Visitor, int I, int... Is>
CUTLASS_DEVICE auto& at_path(Visitor& v, cute::seq<I, Is...>) {
  return at_path(cute::get<I>(v.ops), cute::seq<Is...>{});
}

}  // namespace detail

template <class Root, class... Pairs>
struct Sm90SmemShare : Root {
  CUTLASS_HOST_DEVICE Sm90SmemShare() {}

  CUTLASS_HOST_DEVICE
  Sm90SmemShare(typename Root::Params const& params, typename Root::SharedStorage const& shared_storage)
      : Root(params, shared_storage) {
#if defined(__CUDA_ARCH__)
    (share(Pairs{}), ...);
#endif
  }

 private:
  template <class LoadPath, class StorePath>
  CUTLASS_DEVICE void share(SharePair<LoadPath, StorePath>) {
    auto& load = detail::at_path(*this, LoadPath{});
    auto& store = detail::at_path(*this, StorePath{});
    using StoreElement = cute::remove_pointer_t<decltype(store.smem_aux)>;
    static_assert(cute::is_same_v<cute::remove_pointer_t<decltype(load.smem_aux)>, StoreElement>,
                  "an aux store may only share the buffer of an aux load of its element type");
    store.smem_aux = load.smem_aux;
  }
};

}  // namespace evtc

namespace evtc {

// ---------------------------------------------------------------------------------------------
// A row broadcast without shared memory (evtc planner: a row broadcast's buffer, NOTE [Row
// broadcasts without shared memory] in evtc/plan/sm90.py).
//
// Stock Sm90RowBroadcast copies the CTA's N-slice of the row into shared memory at the start of
// each output tile (one CTA-N row, plus a barrier) and reads each subtile's part from there. A
// thread of the epilogue only ever needs the row elements of its own accumulator columns (8 of a
// 32-column subtile for the WGMMA layouts), and every CTA of a tile column reads the same row,
// so it stays in L1/L2. Sm90RowBroadcastDirect loads those elements straight from global memory
// into registers, one subtile ahead of their use (the loads for subtile n + 1 are issued when
// subtile n begins, so their latency hides behind a subtile's work): no shared memory, no
// barrier, 2 x (elements per subtile) registers. The arguments are Sm90RowBroadcast's.
// ---------------------------------------------------------------------------------------------

template <class CtaTileShapeMNK, class ElementInput, class ElementCompute = ElementInput,
          class StrideMNL = cute::Stride<cute::_0, cute::_1, int64_t>>
struct Sm90RowBroadcastDirect : Sm90ConsumerNode {
  static_assert(cute::is_static_v<decltype(cute::take<0, 2>(StrideMNL{}))> &&
                    cute::take<0, 2>(StrideMNL{}) == cute::Stride<cute::_0, cute::_1>{},
                "a row broadcast has strides (0, 1) along (M, N)");

  struct SharedStorage {};

  struct Arguments {
    ElementInput const* ptr_row = nullptr;
    ElementInput null_default = ElementInput(0);
    StrideMNL dRow = {};
  };

  using Params = Arguments;

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const&, Arguments const& args, void*) {
    return args;
  }

  template <class ProblemShape>
  static bool can_implement(ProblemShape const&, Arguments const& args) {
    return args.ptr_row != nullptr;
  }

  CUTLASS_HOST_DEVICE Sm90RowBroadcastDirect() {}

  CUTLASS_HOST_DEVICE
  Sm90RowBroadcastDirect(Params const& params, SharedStorage const&) : params(params) {}

  Params params;

  CUTLASS_DEVICE bool is_zero() const { return false; }

  template <class GTensor, class CTensor, class RTensor, class FTensor, class ThrResidue>
  struct ConsumerStoreCallbacks : cutlass::epilogue::fusion::detail::EmptyConsumerStoreCallbacks {
    CUTLASS_DEVICE
    ConsumerStoreCallbacks(GTensor tCgRow_, CTensor tCcRow_, RTensor tCrRow_, FTensor tCfRow_,
                           ThrResidue residue_, Params const& params_)
        : tCgRow(tCgRow_), tCcRow(tCcRow_), tCrRow(tCrRow_), tCfRow(tCfRow_), residue(residue_),
          params(params_) {}

    GTensor tCgRow;      // (CPY,CPY_M,CPY_N,EPI_M,EPI_N) global row, stride 0 along M
    CTensor tCcRow;      // (CPY,CPY_M,CPY_N,EPI_M,EPI_N) coordinates relative to the thread's first
    RTensor tCrRow;      // (CPY,CPY_M,CPY_N) the current subtile's values, stride 0 along M
    FTensor tCfRow;      // the next subtile's loaded elements (M modes filtered out)
    ThrResidue residue;  // (m, n) extents left from the thread's first coordinate
    Params const& params;
    int current_n = -1;  // the subtile (along N) that tCrRow holds
    int fetched_n = -1;  // the subtile that tCfRow holds or is loading

    // Issue the loads of subtile column epi_n into tCfRow (predicated on N; rows need no check:
    // the value depends on the column only).
    CUTLASS_DEVICE void fetch(int epi_n) {
      using namespace cute;
      Tensor g = filter_zeros(tCgRow(_, _, _, 0, epi_n));
      Tensor c = filter_zeros(tCcRow(_, _, _, 0, epi_n), tCgRow(_, _, _, 0, epi_n).stride());
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(g); ++i) {
        tCfRow(i) = get<1>(c(i)) < get<1>(residue) ? g(i) : params.null_default;
      }
      fetched_n = epi_n;
    }

    CUTLASS_DEVICE void begin() { fetch(0); }

    CUTLASS_DEVICE void begin_loop(int epi_m, int epi_n) {
      using namespace cute;
      if (epi_n == current_n) {
        return;  // same subtile column as the last subtile (the loop visits M first)
      }
      if (fetched_n != epi_n) {
        fetch(epi_n);  // not prefetched (only if the subtile order isn't the collective's)
      }
      constexpr int FrgSize = decltype(size(tCfRow))::value;
      using ConvertInput = cutlass::NumericArrayConverter<ElementCompute, ElementInput, FrgSize>;
      Tensor frg_in = recast<cutlass::Array<ElementInput, FrgSize>>(coalesce(tCfRow));
      Tensor frg_out = recast<cutlass::Array<ElementCompute, FrgSize>>(filter(tCrRow));
      frg_out(_0{}) = ConvertInput{}(frg_in(_0{}));
      current_n = epi_n;
      if (epi_n + 1 < size<4>(tCgRow)) {
        fetch(epi_n + 1);
      }
    }

    template <typename ElementAccumulator, int FragmentSize>
    CUTLASS_DEVICE cutlass::Array<ElementCompute, FragmentSize>
    visit(cutlass::Array<ElementAccumulator, FragmentSize> const&, int epi_v, int, int) {
      cutlass::Array<ElementCompute, FragmentSize> frg_row;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < FragmentSize; ++i) {
        frg_row[i] = tCrRow(epi_v * FragmentSize + i);
      }
      return frg_row;
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto
  get_consumer_store_callbacks(cutlass::epilogue::fusion::detail::ConsumerStoreArgs<Args...> const& args) {
    using namespace cute;
    auto [M, N, K, L] = args.problem_shape_mnkl;
    Tensor mRow = make_tensor(make_gmem_ptr(params.ptr_row),
                              make_layout(make_layout(M, _0{}), make_layout(N), make_layout(L, get<2>(params.dRow))));
    Tensor tCgRow = cutlass::epilogue::fusion::detail::sm90_partition_for_epilogue<ReferenceSrc>(  // (CPY,CPY_M,CPY_N,EPI_M,EPI_N)
        mRow, args.tile_shape_mnk, args.tile_coord_mnkl, args.epi_tile, args.tiled_copy, args.thread_idx);
    Tensor tCrRow = make_tensor_like<ElementCompute>(take<0, 3>(tCgRow));                  // (CPY,CPY_M,CPY_N)
    Tensor tCfRow = make_tensor_like<ElementInput>(filter_zeros(tCgRow(_, _, _, 0, 0)));
    return ConsumerStoreCallbacks<decltype(tCgRow), decltype(args.tCcD), decltype(tCrRow), decltype(tCfRow),
                                  decltype(args.residue_tCcD)>(
        tCgRow, args.tCcD, tCrRow, tCfRow, args.residue_tCcD, params);
  }
};

}  // namespace evtc
