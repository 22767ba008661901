// evtc::Sm90GroupQuant: per-token-group quantization of D inside the sm90 epilogue
// (evtc.quantize). The root visitor of the tree: it passes the value y through in visit(), and
// in reduce(), where the collective hands it the whole epilogue subtile of y in registers
// before converting it to D's fp8 type and storing it (sm90_epilogue_tma_warpspecialized.hpp:
// cst_callbacks.reduce(..., tRS_rCompute_frg), then NumericArrayConverter, then the TMA store),
// it computes each row's scale from the row's amax, writes the scale, and replaces y by the
// quotient that the collective's cvt.rn.satfinite rounds to fp8.
//
// NOTE [Per-token-group quantization in the epilogue] (evtc/plan/sm90_space.py): the subtile is
// exactly one group wide (Group = EpiN, aligned to the group since the tile N is a multiple of
// it), so a group is one row of the subtile. Its amax is the max over the thread's elements of
// that row, then over the four lanes of its quad, which hold the row's other columns in the
// WGMMA accumulator layout (PTX ISA, "Register fragment wgmma .m64nNk16": row 16 warp + lane/4
// (+ 8), columns 2 (lane % 4) (+ 1, + 8 j)). Which of the thread's elements share a row is
// static: tCcD, the collective's coordinates relative to the thread's first element, has a
// static layout (make_coord_tensor), so the row comparisons below fold at compile time.
//
// The f32 operations are those of the conventions of evtc/testing/quant.py (NOTE
// [Per-token-group quantization conventions]), each correctly rounded (__fdiv_rn, __fmul_rn:
// no fast-math reciprocal, no contraction), with NaN-propagating max and clamp (max.NaN.f32,
// PTX ISA "max": torch's amax, maximum and clamp propagate NaN). Elements outside the problem
// (N or M ragged) count 0 in the amax and are not stored.
#pragma once

#include <cutlass/epilogue/fusion/sm90_visitor_tma_warpspecialized.hpp>

namespace evtc {

// the convention codes (GroupScale.convention; evtc/emit/sm90.py)
enum class QuantConvention : int { kVllm = 0, kSglang = 1, kDeepgemm = 2 };

CUTLASS_DEVICE float max_nan(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

CUTLASS_DEVICE float min_nan(float a, float b) {
  float r;
  asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

// Group: elements per scale (the subtile's N); Convention: a QuantConvention; Qmax: the largest
// finite value of D's fp8 type (448 for e4m3, 57344 for e5m2: OCP 8-bit Floating Point v1.0)
template <int Group, int Convention, int Qmax>
struct Sm90GroupQuant : Sm90ConsumerNode {
  static constexpr QuantConvention kConvention = static_cast<QuantConvention>(Convention);
  // the floor of a group's amax: the sources' epsilons (evtc/ir/quant.py EPS)
  static constexpr float kEps = kConvention == QuantConvention::kDeepgemm ? 1e-4f : 1e-10f;

  struct SharedStorage {};

  // scale (l, m, g) of the (L, M, G) f32 grid (G = ceil(N / Group)) lies at
  // l * batch_stride + m * row_stride + g * group_stride (elements): ScaleLayout.ROW_MAJOR is
  // (G, 1), DeepGEMM's COL_MAJOR_TMA (1, M rounded up to 4) (evtc/testing/quant.py)
  struct Arguments {
    float* ptr_scale = nullptr;
    int64_t batch_stride = 0;    // 0 when L == 1
    int64_t row_stride = 0;
    int64_t group_stride = 1;
  };
  using Params = Arguments;

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const&, Arguments const& args, void*) {
    return args;
  }

  template <class ProblemShape>
  static bool can_implement(ProblemShape const&, Arguments const& args) {
    return args.ptr_scale != nullptr;
  }

  CUTLASS_HOST_DEVICE Sm90GroupQuant() {}
  CUTLASS_HOST_DEVICE Sm90GroupQuant(Params const& params, SharedStorage const&) : params_ptr(&params) {}

  Params const* params_ptr = nullptr;

  template <class CTensor, class Residue>
  struct ConsumerStoreCallbacks : cutlass::epilogue::fusion::detail::EmptyConsumerStoreCallbacks {
    CUTLASS_DEVICE ConsumerStoreCallbacks(CTensor tCcD, Residue residue, int M, int N, int l, Params const* params_ptr)
        : tCcD(tCcD), residue(residue), M(M), N(N), l(l), params_ptr(params_ptr) {}

    CTensor tCcD;      // (CPY,CPY_M,CPY_N,EPI_M,EPI_N) coordinates relative to the thread's first element
    Residue residue;   // (M, N) minus the thread's first element's coordinates
    int M, N, l;
    Params const* params_ptr;

    template <typename ElementAccumulator, typename ElementInput, int FragmentSize>
    CUTLASS_DEVICE cutlass::Array<ElementInput, FragmentSize>
    visit(cutlass::Array<ElementAccumulator, FragmentSize> const&, int, int, int,
          cutlass::Array<ElementInput, FragmentSize> const& frg_input) {
      return frg_input;
    }

    CUTLASS_DEVICE static float quad_max(float v) {
      v = max_nan(v, __shfl_xor_sync(0xffffffff, v, 1));
      return max_nan(v, __shfl_xor_sync(0xffffffff, v, 2));
    }

    template <class STensor, class SyncFn, class VTensor>
    CUTLASS_DEVICE void
    reduce(STensor&&, SyncFn const&, int epi_m, int epi_n, bool, VTensor visit_results) {
      using namespace cute;
      static_assert(cute::is_same_v<typename VTensor::value_type::Element, float>,
                    "evtc.quantize needs the f32 values of the subtile (the root's visit returns f32)");
      Tensor crd = tCcD(_, _, _, epi_m, epi_n);
      constexpr int Size = decltype(size(crd))::value;
      constexpr int Frg = decltype(size(visit_results))::value * VTensor::value_type::kElements;
      static_assert(Size == Frg, "one coordinate per value of the subtile");
      // the subtile's values: the collective's compact register fragment (tRS_rCompute), whose
      // element i is the one at coordinate crd(i)
      Tensor vals = make_tensor(reinterpret_cast<float*>(visit_results.data()), make_layout(Int<Size>{}));
      constexpr float qmax = float(Qmax);
      constexpr float eps = kEps;
      int const row0 = M - int(get<0>(residue));  // the thread's first element's row and column
      int const col0 = N - int(get<1>(residue));
      int64_t const row_stride = params_ptr->row_stride, group_stride = params_ptr->group_stride;
      float* scales = params_ptr->ptr_scale + int64_t(l) * params_ptr->batch_stride;

      // which of the thread's elements share a row: static (the layout of the coordinates
      // relative to the thread's first element); lead[i] is the first element of i's row
      using RelLayout = decltype(tCcD(_, _, _, Int<0>{}, Int<0>{}).layout());
      using Lead = RowLeaders<RelLayout, Size>;
      float amax[Size], scale[Size], mult[Size];  // used at leaders only (static indices: registers)
      cute::for_each(cute::make_int_sequence<Size>{}, [&](auto I) {
        if constexpr (Lead::value[I] == I) {
          amax[I] = 0.f;
        }
      });
      cute::for_each(cute::make_int_sequence<Size>{}, [&](auto I) {
        amax[Lead::value[I]] = max_nan(amax[Lead::value[I]], elem_less(crd(I), residue) ? fabsf(vals(I)) : 0.f);
      });
      cute::for_each(cute::make_int_sequence<Size>{}, [&](auto I) {
        if constexpr (Lead::value[I] == I) {
          float m = max_nan(quad_max(amax[I]), eps);
          if constexpr (kConvention == QuantConvention::kVllm) {
            constexpr float inv = 1.0f / qmax;  // torch: one / qmax, rounded to f32
            scale[I] = __fmul_rn(m, inv);
          } else if constexpr (kConvention == QuantConvention::kSglang) {
            scale[I] = __fdiv_rn(m, qmax);
            mult[I] = __fdiv_rn(1.0f, scale[I]);
          } else {
            mult[I] = __fdiv_rn(qmax, m);
            scale[I] = __fdiv_rn(m, qmax);
          }
        }
      });
      cute::for_each(cute::make_int_sequence<Size>{}, [&](auto I) {
        constexpr int L0 = Lead::value[I];
        float q;
        if constexpr (kConvention == QuantConvention::kVllm) {
          q = min_nan(max_nan(__fdiv_rn(vals(I), scale[L0]), -qmax), qmax);
        } else if constexpr (kConvention == QuantConvention::kSglang) {
          q = min_nan(max_nan(__fmul_rn(vals(I), mult[L0]), -qmax), qmax);
        } else {
          q = __fmul_rn(vals(I), mult[L0]);  // no clamp: the cvt saturates what torch's cast keeps finite
        }
        vals(I) = q;
        // the scale, from the thread that holds the group's first column
        int const row = row0 + int(get<0>(crd(I))), col = col0 + int(get<1>(crd(I)));
        if (col % Group == 0 && row < M && col < N) {
          scales[int64_t(row) * row_stride + int64_t(col / Group) * group_stride] = scale[L0];
        }
      });
    }

  };

  // value[i]: the first j whose row offset under the static layout L is i's (the leader of i's row)
  template <class L, int Size>
  struct RowLeaders {
    template <int... Is>
    static constexpr cute::array<int, Size> make(cute::int_sequence<Is...>) {
      constexpr int rows[] = {int(cute::get<0>(L{}(cute::Int<Is>{})))...};
      cute::array<int, Size> out{};
      for (int i = 0; i < Size; ++i) {
        out[i] = i;
        for (int j = i - 1; j >= 0; --j) {
          if (rows[j] == rows[i]) {
            out[i] = j;
          }
        }
      }
      return out;
    }
    static constexpr cute::array<int, Size> value = make(cute::make_int_sequence<Size>{});
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto
  get_consumer_store_callbacks(cutlass::epilogue::fusion::detail::ConsumerStoreArgs<Args...> const& args) {
    auto [M, N, K, L] = args.problem_shape_mnkl;
    auto [m, n, k, l] = args.tile_coord_mnkl;
    static_assert(cute::size<1>(decltype(args.epi_tile){}) == Group, "the epilogue subtile is one group wide");
    return ConsumerStoreCallbacks<decltype(args.tCcD), decltype(args.residue_tCcD)>(
        args.tCcD, args.residue_tCcD, int(M), int(N), int(l), params_ptr);
  }
};

}  // namespace evtc
