// evtc's visitor nodes for the grouped (pointer-array) kernel: register-direct M x N aux loads and
// stores whose tensor is a different pointer in every group (one entry of the group table per
// group: the group's first row), with the group's own M as the bound. #included by grouped
// kernels only (evtc/emit/sm90_grouped.py).
//
// They reuse CUTLASS's register-direct Sm90AuxLoad / Sm90AuxStore (the Stages = 0 specializations
// of cutlass/epilogue/fusion/sm90_visitor_{load,store}_tma_warpspecialized.hpp: per-thread vector
// accesses predicated against the problem shape) and change only where the tensor is: the
// pointer-array kernel hands the callbacks the group's (M, N, K, 1) and the group index as the
// tile's L coordinate, so the tensor is ptr[l] with L extent l + 1 and L stride 0 (the index is in
// range, the predicate compares against the group's M and N).
#pragma once

#include <cutlass/epilogue/fusion/sm90_visitor_load_tma_warpspecialized.hpp>
#include <cutlass/epilogue/fusion/sm90_visitor_store_tma_warpspecialized.hpp>

namespace evtc {

namespace grouped_detail {
template <class Args>
CUTLASS_DEVICE auto group_shape(Args const& args) {
  auto [M, N, K, L] = args.problem_shape_mnkl;
  auto [m, n, k, l] = args.tile_coord_mnkl;
  return cute::make_shape(M, N, int(l) + 1);
}
}  // namespace grouped_detail

// Aux load: Element ptr_aux[group][m * ld + n] (StrideMNL's L stride must be 0).
template <class Element, class StrideMNL, int Alignment = 128 / cute::sizeof_bits_v<Element>>
struct Sm90AuxLoadGrouped {
  using Base = cutlass::epilogue::fusion::Sm90AuxLoad<0, void, Element, StrideMNL, void, void, Alignment, false>;
  using ElementAux = Element;
  struct SharedStorage {};
  struct Arguments {
    Element const* const* ptr_aux = nullptr;  // one per group, on the device
    Element null_default = Element(0);
    StrideMNL dAux = {};
  };
  using Params = Arguments;

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const&, Arguments const& args, void*) { return args; }
  template <class ProblemShape>
  static bool can_implement(ProblemShape const&, Arguments const&) { return true; }
  template <class ProblemShape>
  static size_t get_workspace_size(ProblemShape const&, Arguments const&) { return 0; }
  template <class ProblemShape>
  static cutlass::Status initialize_workspace(ProblemShape const&, Arguments const&, void*, cudaStream_t,
                                              cutlass::CudaHostAdapter* = nullptr) {
    return cutlass::Status::kSuccess;
  }

  CUTLASS_HOST_DEVICE Sm90AuxLoadGrouped() {}
  CUTLASS_HOST_DEVICE Sm90AuxLoadGrouped(Params const& params, SharedStorage const&) : params_ptr(&params) {}
  Params const* params_ptr = nullptr;

  CUTLASS_DEVICE bool is_producer_load_needed() const { return false; }
  CUTLASS_DEVICE bool is_C_load_needed() const { return false; }
  template <class... Args>
  CUTLASS_DEVICE auto get_producer_load_callbacks(cutlass::epilogue::fusion::ProducerLoadArgs<Args...> const&) {
    return cutlass::epilogue::fusion::EmptyProducerLoadCallbacks{};
  }

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(cutlass::epilogue::fusion::ConsumerStoreArgs<Args...> const& args) {
    using namespace cute;
    auto [m, n, k, l] = args.tile_coord_mnkl;
    auto shape_mnl = grouped_detail::group_shape(args);
    Tensor mAux = make_tensor(make_gmem_ptr(params_ptr->ptr_aux[l]), shape_mnl, params_ptr->dAux);
    Tensor tC_gAux = cutlass::epilogue::fusion::sm90_partition_for_epilogue<ReferenceSrc>(
        mAux, args.tile_shape_mnk, args.tile_coord_mnkl, args.epi_tile, args.tiled_copy, args.thread_idx);
    Tensor tC_rAux = make_tensor<Element>(take<0, 3>(shape(tC_gAux)));
    Tensor tC_cAux = cutlass::epilogue::fusion::sm90_partition_for_epilogue<ReferenceSrc>(
        make_identity_tensor(shape(mAux)), args.tile_shape_mnk, args.tile_coord_mnkl, args.epi_tile, args.tiled_copy,
        args.thread_idx);
    return typename Base::template ConsumerStoreCallbacks<decltype(tC_gAux), decltype(tC_rAux), decltype(tC_cAux),
                                                          decltype(shape_mnl)>(
        cute::move(tC_gAux), cute::move(tC_rAux), cute::move(tC_cAux), shape_mnl, nullptr);
  }
};

// Aux store: Element ptr_aux[group][m * ld + n] = the child's value, rounded.
template <class Element, cutlass::FloatRoundStyle RoundStyle, class StrideMNL,
          int Alignment = 128 / cute::sizeof_bits_v<Element>>
struct Sm90AuxStoreGrouped {
  using Base = cutlass::epilogue::fusion::Sm90AuxStore<0, void, Element, RoundStyle, StrideMNL, void, void, Alignment, false>;
  using ElementAux = Element;
  struct SharedStorage {};
  struct Arguments {
    Element* const* ptr_aux = nullptr;  // one per group, on the device
    StrideMNL dAux = {};
  };
  using Params = Arguments;

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const&, Arguments const& args, void*) { return args; }
  template <class ProblemShape>
  static bool can_implement(ProblemShape const&, Arguments const&) { return true; }
  template <class ProblemShape>
  static size_t get_workspace_size(ProblemShape const&, Arguments const&) { return 0; }
  template <class ProblemShape>
  static cutlass::Status initialize_workspace(ProblemShape const&, Arguments const&, void*, cudaStream_t,
                                              cutlass::CudaHostAdapter* = nullptr) {
    return cutlass::Status::kSuccess;
  }

  CUTLASS_HOST_DEVICE Sm90AuxStoreGrouped() {}
  CUTLASS_HOST_DEVICE Sm90AuxStoreGrouped(Params const& params, SharedStorage const&) : params_ptr(&params) {}
  Params const* params_ptr = nullptr;

  CUTLASS_DEVICE bool is_producer_load_needed() const { return false; }
  CUTLASS_DEVICE bool is_C_load_needed() const { return false; }
  template <class... Args>
  CUTLASS_DEVICE auto get_producer_load_callbacks(cutlass::epilogue::fusion::ProducerLoadArgs<Args...> const&) {
    return cutlass::epilogue::fusion::EmptyProducerLoadCallbacks{};
  }

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(cutlass::epilogue::fusion::ConsumerStoreArgs<Args...> const& args) {
    using namespace cute;
    auto [m, n, k, l] = args.tile_coord_mnkl;
    auto shape_mnl = grouped_detail::group_shape(args);
    Tensor mAux = make_tensor(make_gmem_ptr(params_ptr->ptr_aux[l]), shape_mnl, params_ptr->dAux);
    Tensor tC_gAux = cutlass::epilogue::fusion::sm90_partition_for_epilogue<ReferenceSrc>(
        mAux, args.tile_shape_mnk, args.tile_coord_mnkl, args.epi_tile, args.tiled_copy, args.thread_idx);
    Tensor tC_rAux = make_tensor<Element>(take<0, 3>(shape(tC_gAux)));
    Tensor tC_cAux = cutlass::epilogue::fusion::sm90_partition_for_epilogue<ReferenceSrc>(
        make_identity_tensor(shape(mAux)), args.tile_shape_mnk, args.tile_coord_mnkl, args.epi_tile, args.tiled_copy,
        args.thread_idx);
    return typename Base::template ConsumerStoreCallbacks<decltype(tC_gAux), decltype(tC_rAux), decltype(tC_cAux),
                                                          decltype(shape_mnl)>(
        cute::move(tC_gAux), cute::move(tC_rAux), cute::move(tC_cAux), shape_mnl, nullptr);
  }
};

}  // namespace evtc
