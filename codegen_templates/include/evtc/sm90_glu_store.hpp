// evtc::Sm90GluStore: the one-GEMM gated form (evtc.glu) inside the sm90 epilogue. The root
// visitor of the tree: it passes the value y through in visit(), and in reduce(), where the
// collective hands it the whole epilogue subtile of y in registers
// (sm90_epilogue_tma_warpspecialized.hpp: cst_callbacks.reduce(sD_epi(...), ..., tRS_rCompute_frg)),
// it pairs each gate column with its up column, computes act(gate) * up, writes the EpiM x EpiN/2
// result into the collective's D buffer of this subtile and, where the collective would issue
// D's TMA store (tma_store_fn: after fence_view_async_shared and a barrier of the epilogue
// threads), issues a TMA store of it into the M x N/2 output.
//
// NOTE [The gated epilogue]: the GEMM runs over B = [W_gate; W_up] with their rows interleaved
// (evtc.interleave_gate_up: column 2j of the accumulator is gate j, column 2j + 1 its up), so a
// pair is two adjacent columns. The WGMMA accumulator layout gives each thread columns 2c and
// 2c + 1 of its rows (PTX ISA, "Register fragment wgmma .m64nNk16": row 16 warp + lane/4 (+ 8),
// columns 2 (lane % 4) (+ 1, + 8 j)), so every pair lies in one thread's registers, whatever the
// tile: which of the thread's elements pair up is static (tCcD, the collective's coordinates
// relative to the thread's first element, has a static layout), found at compile time, and a
// layout without pairs is a compile error, never a wrong result. Swap-AB (which transposes the
// tile: a pair would lie along the accumulator's M) is refused by the planner. D is void in the
// collective, so its D buffer (CollectiveStorageWithoutC::smem_D, EpiM x EpiN elements a stage)
// is free: the EpiM x EpiN/2 result goes there, row-major without swizzle, and the collective's
// store pipeline, which commits and waits on the issuing warp's bulk groups, guards it as it
// would guard D. DelayTmaStore must be off (the plan of void-D variants sets it so): the TMA
// store of a subtile follows its reduce() before the next one's.
#pragma once

#include <cutlass/epilogue/fusion/sm90_visitor_tma_warpspecialized.hpp>

namespace evtc {

namespace glu_detail {

// value[i]: the element of the thread whose coordinate under the static layout L is i's plus
// one column, for i at an even column; -1 for the others (the up halves)
template <class L, int Size>
struct UpPartners {
  template <int... Is>
  static constexpr cute::array<int, Size> make(cute::int_sequence<Is...>) {
    constexpr int rows[] = {int(cute::get<0>(L{}(cute::Int<Is>{})))...};
    constexpr int cols[] = {int(cute::get<1>(L{}(cute::Int<Is>{})))...};
    cute::array<int, Size> out{};
    for (int i = 0; i < Size; ++i) {
      out[i] = -1;
      if (cols[i] % 2 == 0) {
        out[i] = -2;  // a gate without its up: no pair (static_assert below)
        for (int j = 0; j < Size; ++j) {
          if (rows[j] == rows[i] && cols[j] == cols[i] + 1) {
            out[i] = j;
          }
        }
      }
    }
    return out;
  }
  static constexpr cute::array<int, Size> value = make(cute::make_int_sequence<Size>{});
  static constexpr bool complete() {
    for (int i = 0; i < Size; ++i) {
      if (value[i] == -2) {
        return false;
      }
    }
    return true;
  }
  static constexpr int rank(int i) {  // the pairs before element i
    int n = 0;
    for (int j = 0; j < i; ++j) {
      n += value[j] >= 0;
    }
    return n;
  }
  static constexpr int pairs() { return rank(Size); }
};

// The gated values of one epilogue subtile: visit_results (the collective's register fragment of
// the subtile, element i at coordinate crd(i) relative to the thread's first element) paired
// column 2c with 2c + 1, act(gate) * up as Sm90Compute applies a functor (to an Array of f32).
// Calls store(Q, I, value) for each pair Q, I its gate's element (indices are constants: static
// members aren't read on the device, and the arrays stay in registers).
template <template <class> class ActFn, class RelLayout, class CTensor, class VTensor, class Store>
CUTLASS_DEVICE void gated(CTensor const& crd, VTensor visit_results, Store&& store) {
  using namespace cute;
  static_assert(cute::is_same_v<typename VTensor::value_type::Element, float>,
                "evtc.glu pairs the f32 values of the subtile (the root's visit returns f32)");
  constexpr int Size = decltype(size(crd))::value;
  constexpr int Frg = decltype(size(visit_results))::value * VTensor::value_type::kElements;
  static_assert(Size == Frg, "one coordinate per value of the subtile");
  Tensor vals = make_tensor(reinterpret_cast<float*>(visit_results.data()), make_layout(Int<Size>{}));
  using Up = UpPartners<RelLayout, Size>;
  static_assert(Up::complete(), "NOTE [The gated epilogue]: every gate column's up column lies in the same "
                                "thread (the WGMMA accumulator layout); this layout breaks a pair");
  constexpr int P = Up::pairs();
  cutlass::Array<float, P> gate, up;
  cute::for_each(cute::make_int_sequence<Size>{}, [&](auto I) {
    if constexpr (Up::value[I] >= 0) {
      constexpr int J = Up::value[I], Q = Up::rank(I);
      gate[Q] = vals(I);
      up[Q] = vals(J);
    }
  });
  cutlass::Array<float, P> out = cutlass::multiplies<cutlass::Array<float, P>>{}(
      ActFn<cutlass::Array<float, P>>{}(gate), up);
  cute::for_each(cute::make_int_sequence<Size>{}, [&](auto I) {
    if constexpr (Up::value[I] >= 0) {
      constexpr int Q = Up::rank(I);
      store(I, out[Q]);
    }
  });
}

}  // namespace glu_detail

// Element: the output's type; ActFn: the gate's activation functor (applied to an Array of f32,
// as Sm90Compute applies it); TileM/N, EpiM/N: the CTA tile and the epilogue subtile
template <class Element, template <class> class ActFn, int TileM, int TileN, int EpiM, int EpiN>
struct Sm90GluStore : Sm90ConsumerNode {
  using ElementAux = Element;  // what the collective's void-D buffers take (get_element_aux_t)
  static_assert(EpiN % 2 == 0 && TileN % 2 == 0, "the subtile holds whole (gate, up) pairs");
  static_assert((EpiN / 2) * int(sizeof(Element)) % 16 == 0,
                "TMA stores rows of whole 16-byte vectors: the half subtile's row must be a multiple of 16 bytes");
  using StrideMNL = cute::Stride<int64_t, cute::_1, int64_t>;  // the M x N/2 output, row-major, batched
  using SmemLayoutOut = cute::Layout<cute::Shape<cute::Int<EpiM>, cute::Int<EpiN / 2>>,
                                     cute::Stride<cute::Int<EpiN / 2>, cute::_1>>;

  struct SharedStorage {};

  struct Arguments {
    Element* ptr_out = nullptr;
    StrideMNL dOut = {};
  };

  struct Params {
    using TMA_Out = decltype(cute::make_tma_copy(
        cute::SM90_TMA_STORE{},
        cute::make_tensor(static_cast<Element*>(nullptr), cute::repeat_like(StrideMNL{}, int32_t(0)), StrideMNL{}),
        SmemLayoutOut{}));
    TMA_Out tma_store_out;
  };

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const& problem_shape, Arguments const& args, void*) {
    auto [M, N, K, L] = cute::append<4>(problem_shape, 1);
    cute::Tensor out = cute::make_tensor(args.ptr_out, cute::make_layout(cute::make_shape(int(M), int(N) / 2, int(L)),
                                                                         args.dOut));
    return {cute::make_tma_copy(cute::SM90_TMA_STORE{}, out, SmemLayoutOut{})};
  }

  template <class ProblemShape>
  static bool can_implement(ProblemShape const& problem_shape, Arguments const& args) {
    auto [M, N, K, L] = cute::append<4>(problem_shape, 1);
    return args.ptr_out != nullptr && int(N) % 2 == 0;
  }

  CUTLASS_HOST_DEVICE Sm90GluStore() {}
  CUTLASS_HOST_DEVICE Sm90GluStore(Params const& params, SharedStorage const&) : params_ptr(&params) {}

  Params const* params_ptr = nullptr;

  template <class CTensor, class Residue, class GTensor>
  struct ConsumerStoreCallbacks : cutlass::epilogue::fusion::detail::EmptyConsumerStoreCallbacks {
    CUTLASS_DEVICE ConsumerStoreCallbacks(CTensor tCcD, Residue residue, GTensor bSG_gOut, int M, int N, int row_tile,
                                          int col_tile, Params const* params_ptr)
        : tCcD(tCcD), residue(residue), bSG_gOut(bSG_gOut), M(M), N(N), row_tile(row_tile), col_tile(col_tile),
          params_ptr(params_ptr) {}

    CTensor tCcD;       // (CPY,CPY_M,CPY_N,EPI_M,EPI_N) coordinates relative to the thread's first element
    Residue residue;    // (M, N) minus the thread's first element's coordinates
    GTensor bSG_gOut;   // (TMA,TMA_M,TMA_N,EPI_M,EPI_N) the output's subtiles, as TMA partitions them
    int M, N, row_tile, col_tile;  // row_tile, col_tile: the CTA tile's first row and column
    Params const* params_ptr;
    Element* smem_out = nullptr;   // this subtile's EpiM x EpiN/2 result (set by reduce)

    template <typename ElementAccumulator, typename ElementInput, int FragmentSize>
    CUTLASS_DEVICE cutlass::Array<float, FragmentSize>
    visit(cutlass::Array<ElementAccumulator, FragmentSize> const&, int, int, int,
          cutlass::Array<ElementInput, FragmentSize> const& frg_input) {
      return cutlass::NumericArrayConverter<float, ElementInput, FragmentSize>{}(frg_input);
    }

    template <class STensor, class SyncFn, class VTensor>
    CUTLASS_DEVICE void
    reduce(STensor&& smem_buffer, SyncFn const&, int epi_m, int epi_n, bool, VTensor visit_results) {
      using namespace cute;
      Tensor crd = tCcD(_, _, _, epi_m, epi_n);
      using RelLayout = decltype(tCcD(_, _, _, Int<0>{}, Int<0>{}).layout());
      // into this subtile's D buffer (free: D is void), row-major EpiM x EpiN/2
      smem_out = reinterpret_cast<Element*>(raw_pointer_cast(&smem_buffer(0)));
      int const row0 = M - int(get<0>(residue)) - row_tile - epi_m * EpiM;  // the thread's first element,
      int const col0 = N - int(get<1>(residue)) - col_tile - epi_n * EpiN;  // within the subtile
      cutlass::NumericConverter<Element, float> convert;
      Element* out = smem_out;
      glu_detail::gated<ActFn, RelLayout>(crd, visit_results, [&](auto I, float v) {
        int const r = row0 + int(get<0>(crd(I))), c = col0 + int(get<1>(crd(I)));
        out[r * (EpiN / 2) + c / 2] = convert(v);
      });
    }

    CUTLASS_DEVICE void
    tma_store(int epi_m, int epi_n, int, bool issue_tma_store) {
      using namespace cute;
      if (issue_tma_store) {
        Tensor sOut = make_tensor(make_smem_ptr(smem_out), SmemLayoutOut{});
        ThrCopy thrblk_s2g = params_ptr->tma_store_out.get_slice(_0{});
        copy(params_ptr->tma_store_out, thrblk_s2g.partition_S(sOut), bSG_gOut(_, _, _, epi_m, epi_n));
      }
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto
  get_consumer_store_callbacks(cutlass::epilogue::fusion::detail::ConsumerStoreArgs<Args...> const& args) {
    using namespace cute;
    auto [M, N, K, L] = args.problem_shape_mnkl;
    auto [m, n, k, l] = args.tile_coord_mnkl;
    static_assert(size<0>(decltype(args.epi_tile){}) == EpiM && size<1>(decltype(args.epi_tile){}) == EpiN,
                  "the epilogue subtile the plan names");
    Tensor mOut = params_ptr->tma_store_out.get_tma_tensor(make_shape(int(M), int(N) / 2, int(L)));  // (M,N/2,L)
    Tensor gOut = local_tile(mOut, Shape<Int<TileM>, Int<TileN / 2>>{}, make_coord(m, n, l));       // (CTA_M,CTA_N/2)
    Tensor gOut_epi = flat_divide(gOut, Shape<Int<EpiM>, Int<EpiN / 2>>{});       // (EPI_M',EPI_N',EPI_M,EPI_N)
    ThrCopy thrblk_s2g = params_ptr->tma_store_out.get_slice(_0{});
    auto bSG_gOut = thrblk_s2g.partition_D(gOut_epi);                            // (TMA,TMA_M,TMA_N,EPI_M,EPI_N)
    return ConsumerStoreCallbacks<decltype(args.tCcD), decltype(args.residue_tCcD), decltype(bSG_gOut)>(
        args.tCcD, args.residue_tCcD, bSG_gOut, int(M), int(N), int(m) * TileM, int(n) * TileN, params_ptr);
  }
};

// The gated store of the grouped (pointer-array) kernel: the same pairs, stored register-direct
// through the group's own pointer (one entry of the group table per group: the group's first
// row of the (T, N/2) output, row stride ld), predicated by the group's M and N (the
// pointer-array collective hands the callbacks the group's problem shape and the group as the
// tile's L coordinate: include/evtc/sm90_grouped.hpp). No TMA: a group's rows start anywhere.
template <class Element, template <class> class ActFn, int EpiM, int EpiN>
struct Sm90GluStoreGrouped : Sm90ConsumerNode {
  using ElementAux = Element;
  static_assert(EpiN % 2 == 0, "the subtile holds whole (gate, up) pairs");

  struct SharedStorage {};
  struct Arguments {
    Element* const* ptr_out = nullptr;  // one per group, on the device
    int64_t ld = 0;                     // the output's row stride (elements), the same in every group
  };
  using Params = Arguments;

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const&, Arguments const& args, void*) { return args; }
  template <class ProblemShape>
  static bool can_implement(ProblemShape const&, Arguments const& args) { return args.ptr_out != nullptr; }

  CUTLASS_HOST_DEVICE Sm90GluStoreGrouped() {}
  CUTLASS_HOST_DEVICE Sm90GluStoreGrouped(Params const& params, SharedStorage const&) : params_ptr(&params) {}
  Params const* params_ptr = nullptr;

  template <class CTensor, class Residue>
  struct ConsumerStoreCallbacks : cutlass::epilogue::fusion::detail::EmptyConsumerStoreCallbacks {
    CUTLASS_DEVICE ConsumerStoreCallbacks(CTensor tCcD, Residue residue, Element* out, int64_t ld, int M, int N)
        : tCcD(tCcD), residue(residue), out(out), ld(ld), M(M), N(N) {}

    CTensor tCcD;     // (CPY,CPY_M,CPY_N,EPI_M,EPI_N) coordinates relative to the thread's first element
    Residue residue;  // the group's (M, N) minus the thread's first element's coordinates
    Element* out;     // the group's first row of the output
    int64_t ld;
    int M, N;

    template <typename ElementAccumulator, typename ElementInput, int FragmentSize>
    CUTLASS_DEVICE cutlass::Array<float, FragmentSize>
    visit(cutlass::Array<ElementAccumulator, FragmentSize> const&, int, int, int,
          cutlass::Array<ElementInput, FragmentSize> const& frg_input) {
      return cutlass::NumericArrayConverter<float, ElementInput, FragmentSize>{}(frg_input);
    }

    template <class STensor, class SyncFn, class VTensor>
    CUTLASS_DEVICE void
    reduce(STensor&&, SyncFn const&, int epi_m, int epi_n, bool, VTensor visit_results) {
      using namespace cute;
      Tensor crd = tCcD(_, _, _, epi_m, epi_n);
      using RelLayout = decltype(tCcD(_, _, _, Int<0>{}, Int<0>{}).layout());
      int const row0 = M - int(get<0>(residue)), col0 = N - int(get<1>(residue));  // within the group
      cutlass::NumericConverter<Element, float> convert;
      glu_detail::gated<ActFn, RelLayout>(crd, visit_results, [&](auto I, float v) {
        int const r = row0 + int(get<0>(crd(I))), c = col0 + int(get<1>(crd(I)));
        if (r < M && c < N) {
          out[int64_t(r) * ld + c / 2] = convert(v);
        }
      });
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto
  get_consumer_store_callbacks(cutlass::epilogue::fusion::detail::ConsumerStoreArgs<Args...> const& args) {
    auto [M, N, K, L] = args.problem_shape_mnkl;
    auto [m, n, k, l] = args.tile_coord_mnkl;
    static_assert(cute::size<0>(decltype(args.epi_tile){}) == EpiM && cute::size<1>(decltype(args.epi_tile){}) == EpiN,
                  "the epilogue subtile the plan names");
    return ConsumerStoreCallbacks<decltype(args.tCcD), decltype(args.residue_tCcD)>(
        args.tCcD, args.residue_tCcD, params_ptr->ptr_out[l], params_ptr->ld, int(M), int(N));
  }
};

}  // namespace evtc
