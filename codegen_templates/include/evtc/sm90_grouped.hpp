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
#include <cutlass/functional.h>

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
struct Sm90AuxLoadGrouped : Sm90ConsumerNode {
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

  CUTLASS_HOST_DEVICE Sm90AuxLoadGrouped() {}
  CUTLASS_HOST_DEVICE Sm90AuxLoadGrouped(Params const& params, SharedStorage const&) : params_ptr(&params) {}
  Params const* params_ptr = nullptr;

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
struct Sm90AuxStoreGrouped : Sm90ConsumerNode {
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

  CUTLASS_HOST_DEVICE Sm90AuxStoreGrouped() {}
  CUTLASS_HOST_DEVICE Sm90AuxStoreGrouped(Params const& params, SharedStorage const&) : params_ptr(&params) {}
  Params const* params_ptr = nullptr;

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

// NOTE [Reductions in the grouped kernel]: a row reduction (one value per token: T,), a column
// reduction (one row per group: E x N) or a scalar reduction (one value per group: E,) of a value
// of the epilogue, through atomics into the output, which evtc fills with the reduction's identity
// on the stream first (evtc/grouped.py; CUTLASS's reduction visitors take one pointer and a batch
// stride, and their workspace is laid out by uniform tiles, not by the group scheduler's). The
// output is a pointer per group from the group table: the group's first token (rows), or its row
// of E x N (columns), or its element (scalars). visit() keeps the subtile's values of the node's
// operand (f32, element i at coordinate tCcD(i) relative to the thread's first element) and passes
// them through; reduce() reduces them: per row over the thread's elements, then across the quad
// (the four lanes of a row in the WGMMA accumulator layout, PTX ISA "Register fragment wgmma
// .m64nNk16"), one atomic per row from the quad's first lane; per column over the thread's
// elements, then across the 8 lanes of a column (lane / 4), one atomic per warp and column; a
// scalar over the thread, then the warp, one atomic per warp. Elements outside the group's M x N
// count the identity. Sums through float atomics depend on the order of arrival (not
// deterministic); max and min do not. evtc fills the output with the identity before the launch
// (no workspace).
template <int Axis, template <class> class ReduceFn, template <class> class AtomicFn, int Identity>
struct Sm90ReductionGrouped : Sm90ConsumerNode {  // Axis 1: a row reduction (over N), 0: a column reduction, -1: scalar
  struct SharedStorage {};
  struct Arguments {
    float* const* ptr_out = nullptr;  // one per group, on the device (the group table)
  };
  using Params = Arguments;

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const&, Arguments const& args, void*) { return args; }
  template <class ProblemShape>
  static bool can_implement(ProblemShape const&, Arguments const& args) { return args.ptr_out != nullptr; }

  CUTLASS_HOST_DEVICE Sm90ReductionGrouped() {}
  CUTLASS_HOST_DEVICE Sm90ReductionGrouped(Params const& params, SharedStorage const&) : params_ptr(&params) {}
  Params const* params_ptr = nullptr;

  // the identity as a float (Identity: 0 sum, 1 max, 2 min)
  static CUTLASS_DEVICE float identity() {
    return Identity == 0 ? 0.f : (Identity == 1 ? -cutlass::platform::numeric_limits<float>::infinity()
                                                : cutlass::platform::numeric_limits<float>::infinity());
  }

  template <class CTensor, class Residue, int Size>
  struct ConsumerStoreCallbacks : cutlass::epilogue::fusion::EmptyConsumerStoreCallbacks {
    CUTLASS_DEVICE ConsumerStoreCallbacks(CTensor tCcD, Residue residue, float* out, int M, int N)
        : tCcD(tCcD), residue(residue), out(out), M(M), N(N) {}

    CTensor tCcD;
    Residue residue;  // the group's (M, N) minus the thread's first element's coordinates
    float* out;       // the group's output (its first token, its row, its element)
    int M, N;
    float vals[Size];  // this subtile's values of the operand (registers: static indices)

    template <typename ElementAccumulator, typename ElementInput, int FragmentSize>
    CUTLASS_DEVICE cutlass::Array<ElementInput, FragmentSize>
    visit(cutlass::Array<ElementAccumulator, FragmentSize> const&, int epi_v, int, int,
          cutlass::Array<ElementInput, FragmentSize> const& frg_input) {
      cutlass::NumericArrayConverter<float, ElementInput, FragmentSize> cvt;
      cutlass::Array<float, FragmentSize> f = cvt(frg_input);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < FragmentSize; ++i) {
        vals[epi_v * FragmentSize + i] = f[i];
      }
      return frg_input;
    }

    CUTLASS_DEVICE static float shfl_reduce(float v, int lane_mask) {
      ReduceFn<float> op;
      return op(v, __shfl_xor_sync(0xffffffff, v, lane_mask));
    }

    template <class STensor, class SyncFn, class VTensor>
    CUTLASS_DEVICE void
    reduce(STensor&&, SyncFn const&, int epi_m, int epi_n, bool, VTensor) {
      using namespace cute;
      Tensor crd = tCcD(_, _, _, epi_m, epi_n);
      static_assert(decltype(size(crd))::value == Size, "one value per coordinate of the subtile");
      ReduceFn<float> op;
      AtomicFn<float> atomic;
      int const row0 = M - int(get<0>(residue)), col0 = N - int(get<1>(residue));
      int const lane = threadIdx.x % 32;
      if constexpr (Axis == -1) {
        float v = identity();
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < Size; ++i) {
          bool in = row0 + int(get<0>(crd(i))) < M && col0 + int(get<1>(crd(i))) < N;
          v = in ? op(v, vals[i]) : v;
        }
        CUTLASS_PRAGMA_UNROLL
        for (int mask = 1; mask < 32; mask *= 2) {
          v = shfl_reduce(v, mask);
        }
        if (lane == 0) {
          atomic(out, v);
        }
      } else {
        // the distinct rows (Axis 1) or columns (Axis 0) of the thread's elements: static
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < Size; ++i) {
          int const key_i = Axis == 1 ? int(get<0>(crd(i))) : int(get<1>(crd(i)));
          bool first = true;
          CUTLASS_PRAGMA_UNROLL
          for (int j = 0; j < i; ++j) {
            first = first && (Axis == 1 ? int(get<0>(crd(j))) : int(get<1>(crd(j)))) != key_i;
          }
          if (first) {  // (the same on every lane: the coordinates' layout is static)
            float v = identity();
            CUTLASS_PRAGMA_UNROLL
            for (int j = 0; j < Size; ++j) {
              int const key_j = Axis == 1 ? int(get<0>(crd(j))) : int(get<1>(crd(j)));
              bool in = row0 + int(get<0>(crd(j))) < M && col0 + int(get<1>(crd(j))) < N;
              v = (key_j == key_i && in) ? op(v, vals[j]) : v;
            }
            if constexpr (Axis == 1) {  // a row's four lanes: lane % 4
              v = shfl_reduce(v, 1);
              v = shfl_reduce(v, 2);
              int const r = row0 + key_i;
              if (lane % 4 == 0 && r < M) {
                atomic(out + r, v);
              }
            } else {  // a column's eight lanes: lane / 4
              v = shfl_reduce(v, 4);
              v = shfl_reduce(v, 8);
              v = shfl_reduce(v, 16);
              int const c = col0 + key_i;
              if (lane < 4 && c < N) {
                atomic(out + c, v);
              }
            }
          }
        }
      }
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(cutlass::epilogue::fusion::ConsumerStoreArgs<Args...> const& args) {
    using namespace cute;
    auto [M, N, K, L] = args.problem_shape_mnkl;
    auto [m, n, k, l] = args.tile_coord_mnkl;
    constexpr int Size = decltype(size(args.tCcD(_, _, _, Int<0>{}, Int<0>{})))::value;
    return ConsumerStoreCallbacks<decltype(args.tCcD), decltype(args.residue_tCcD), Size>(
        args.tCcD, args.residue_tCcD, params_ptr->ptr_out[l], int(M), int(N));
  }
};

}  // namespace evtc
