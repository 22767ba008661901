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
