// evtc's own sm90 visitor nodes (the Sm90 EVT node interface of
// cutlass/epilogue/fusion/sm90_visitor_tma_warpspecialized.hpp). Included verbatim.
#pragma once

#include <cutlass/epilogue/fusion/sm90_visitor_tma_warpspecialized.hpp>

namespace evtc {

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

// ---------------------------------------------------------------------------------------------
// Shared-memory aliasing between an aux load and an aux store (evtc planner, NOTE [Aux buffer
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
// Sm90AliasedAuxStore<Store> is Store (a Sm90AuxStore with Stages == StagesC) without its own
// shared storage; Sm90SmemAlias<Root, AliasPair<LoadPath, StorePath>...> wraps the fusion root
// and, after constructing the tree, points each aliased store at its load's buffer. A path is the
// sequence of indices into the nested `ops` tuples (Sm90VisitorImplBase::ops) from the root.
// ---------------------------------------------------------------------------------------------

template <class Store>
struct Sm90AliasedAuxStore : Store {
  struct SharedStorage {};

  CUTLASS_HOST_DEVICE Sm90AliasedAuxStore() {}

  CUTLASS_HOST_DEVICE
  Sm90AliasedAuxStore(typename Store::Params const& params, SharedStorage const& shared_storage)
      // The base only takes the address of its buffer; the alias wrapper repoints it.
      : Store(params, *reinterpret_cast<typename Store::SharedStorage const*>(&shared_storage)) {}
};

template <class LoadPath, class StorePath>
struct AliasPair {};

namespace detail {

template <class Visitor>
CUTLASS_DEVICE auto& at_path(Visitor& v, cute::seq<>) { return v; }

template <class Visitor, int I, int... Is>
CUTLASS_DEVICE auto& at_path(Visitor& v, cute::seq<I, Is...>) {
  return at_path(cute::get<I>(v.ops), cute::seq<Is...>{});
}

}  // namespace detail

template <class Root, class... Pairs>
struct Sm90SmemAlias : Root {
  CUTLASS_HOST_DEVICE Sm90SmemAlias() {}

  CUTLASS_HOST_DEVICE
  Sm90SmemAlias(typename Root::Params const& params, typename Root::SharedStorage const& shared_storage)
      : Root(params, shared_storage) {
#if defined(__CUDA_ARCH__)
    (alias(Pairs{}), ...);
#endif
  }

 private:
  template <class LoadPath, class StorePath>
  CUTLASS_DEVICE void alias(AliasPair<LoadPath, StorePath>) {
    auto& load = detail::at_path(*this, LoadPath{});
    auto& store = detail::at_path(*this, StorePath{});
    using StoreElement = cute::remove_pointer_t<decltype(store.smem_aux)>;
    static_assert(cute::is_same_v<cute::remove_pointer_t<decltype(load.smem_aux)>, StoreElement>,
                  "an aux store may only share the buffer of an aux load of its element type");
    store.smem_aux = load.smem_aux;
  }
};

}  // namespace evtc
