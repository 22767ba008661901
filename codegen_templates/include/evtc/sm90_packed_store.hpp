// evtc::Sm90AuxStorePacked: an M x N aux store into rows that are only element-aligned (a
// caller's packed tensor with N = 50257 in bf16), written from the epilogue's shared-memory
// subtile by the epilogue threads themselves, row by row. #included by the kernels that use it
// (GemmConfig.packed_stores; NOTE [Stores into packed rows] in evtc/plan/sm90.py).
//
// TMA can't write such rows: its descriptor needs a 16-byte aligned base and 16-byte multiples
// for every global stride (cuTensorMapEncodeTiled, CUDA driver API), and a box per row phase
// (row mod 8, whose rows share an alignment) faulted on the H100 wherever its first column was
// not 16-byte aligned (docs/performance.md, 2026-11-26). The accumulator fragment's own layout
// can't store such rows fast either: each thread holds 2 adjacent columns of 8 rows, so a warp's
// store touches 8 rows at once, element by element (GemmConfig.unaligned: +14 % at 4096 x 50257
// x 4096). Here the subtile goes to shared memory as for a TMA store (stmatrix, the stock swizzled
// layout of Sm90AuxStore), and where the collective would issue the TMA store every epilogue
// thread copies a share of it to global memory: warp w takes Rw = EpiM / warps consecutive rows,
// lane i columns i, i + 32, ..., so each store instruction writes 32 consecutive elements of one
// row, predicated on M and N (no element outside the tensor is written, whatever N or M).
//
// The shared-memory addresses take no layout arithmetic per element (copy_fast): the swizzle XORs
// bits inside one atom of 8 rows, so offset(8 a + k, c) = offset(8 a, 0) + (offset(k, 0) ^
// offset(0, c)), with the first two static after unrolling and the last one per thread; the host
// checks that identity over the whole subtile (fast_layout) and a layout without it takes the
// generic copy. Measured on the H100 (docs/performance.md, 2026-11-26, 4096 x 50257 x 4096):
// CuTe's run-time indexing per element took ~39 instructions per stored element (Nsight Compute:
// 899 M instructions against 398 M for the TMA kernel) and 1.20x the aligned time for a row-max
// epilogue; this copy 1.04x. Chunks of 16 or 4 bytes aligned to the global row, with the head
// and tail of each row element by element, were slower still (1.26x and 1.55x: divergent lanes).
//
// Synchronisation: CUTLASS's collective calls tma_store() on every epilogue thread between two
// named-barrier syncs of all epilogue threads (sm90_epilogue_tma_warpspecialized.hpp,
// tma_store_fn: synchronize(); ... cst_callbacks.tma_store(...); ...; synchronize()), so every
// thread's shared-memory writes (postreduce) are visible before the copy and every thread has read
// the subtile before any thread writes the next one into the same stage.
//
// Limits (the planner and the host check them: evtc/plan/sm90.py, evtc/runtime/staging.py):
// row-major (not swap-AB), elements of 8 bits or more, a base address aligned to the element.
#pragma once

#include <cutlass/epilogue/fusion/sm90_visitor_tma_warpspecialized.hpp>

namespace evtc {

template <int Stages, class EpilogueTile, class Element, cutlass::FloatRoundStyle RoundStyle, class StrideMNL,
          class SmemLayoutAtom, class CopyOpR2S>
struct Sm90AuxStorePacked : Sm90ConsumerNode {
  static_assert(Stages > 0, "a packed store goes through shared memory");
  static_assert(cutlass::sizeof_bits_v<Element> >= 8, "packed stores write whole bytes");
  static_assert(cute::is_static_v<decltype(cute::get<1>(StrideMNL{}))>, "row-major M x N tensors only");
  static constexpr int EpiM = cute::size<0>(EpilogueTile{});
  static constexpr int EpiN = cute::size<1>(EpilogueTile{});
  static constexpr int Bytes = cutlass::sizeof_bits_v<Element> / 8;
  static_assert(EpiN % (16 / Bytes) == 0, "the epilogue tile N must be a multiple of the 16-byte vector");

  using ElementAux = Element;
  // the stock Sm90AuxStore layout (sm90_visitor_store_tma_warpspecialized.hpp), row-major
  using SmemLayout = decltype(cute::tile_to_shape(
      SmemLayoutAtom{}, cute::make_shape(cute::Int<EpiM>{}, cute::Int<EpiN>{}, cute::Int<Stages>{}),
      cute::Step<cute::_1, cute::_2, cute::_3>{}));

  struct SharedStorage {
    alignas(cutlass::detail::alignment_for_swizzle(SmemLayout{}))
    cute::array_aligned<Element, cute::size(SmemLayout{})> smem_aux;
  };

  struct Arguments {
    Element* ptr_aux = nullptr;
    StrideMNL dAux = {};
  };

  // the shared-memory layout with its swizzle on element offsets (base aligned to the swizzle)
  using SmemLayoutPI = decltype(cute::as_position_independent_swizzle_tensor(
      cute::make_tensor(cute::make_smem_ptr(static_cast<Element*>(nullptr)), SmemLayout{})).layout());

  // The fast copy's premise (ConsumerStoreCallbacks::copy_fast), checked over the whole subtile:
  // the offset of (8 a + k, c) is offset(8 a, 0) + (offset(k, 0) ^ offset(0, c)) for k < 8 (the
  // swizzle XORs bits inside one atom of 8 rows, its period), and stages are a constant apart.
  static bool fast_layout() {
    SmemLayoutPI L{};
    for (int r = 0; r < EpiM; ++r) {
      for (int c = 0; c < EpiN; ++c) {
        int a = r - r % 8;
        if (int(L(r, c, 0)) != int(L(a, 0, 0)) + (int(L(r % 8, 0, 0)) ^ int(L(0, c, 0)))) {
          return false;
        }
        if (Stages > 1 && int(L(r, c, 1)) != int(L(r, c, 0)) + int(L(0, 0, 1))) {
          return false;
        }
      }
    }
    return true;
  }

  struct Params {
    Element* ptr_aux = nullptr;
    StrideMNL dAux = {};
    bool fast = false;  // fast_layout()
  };

  template <class ProblemShape>
  static Params
  to_underlying_arguments(ProblemShape const&, Arguments const& args, void*) {
    static bool const fast = fast_layout();
    return {args.ptr_aux, args.dAux, fast};
  }

  template <class ProblemShape>
  static bool can_implement(ProblemShape const&, Arguments const& args) {
    return reinterpret_cast<uintptr_t>(args.ptr_aux) % Bytes == 0;
  }

  CUTLASS_HOST_DEVICE Sm90AuxStorePacked() {}

  CUTLASS_HOST_DEVICE Sm90AuxStorePacked(Params const& params, SharedStorage const& shared_storage)
      : params_ptr(&params), smem_aux(const_cast<Element*>(shared_storage.smem_aux.data())) {}

  Params const* params_ptr;
  Element* smem_aux;

  template <int Threads, class RTensor, class TiledR2S, class STensorR2S, class STensor, class ProblemShapeMNL,
            class TileOrigin>
  struct ConsumerStoreCallbacks : cutlass::epilogue::fusion::detail::EmptyConsumerStoreCallbacks {
    // The fast copy: lane i of a warp stores columns i, i + 32, .. of the warp's Rw consecutive
    // subtile rows, so each store instruction writes one row's 32 consecutive elements, and the
    // shared-memory address of every element is a per-thread constant (8 rows of a swizzle atom)
    // plus compile-time multiples of the atom's size: no layout arithmetic per element (nsight
    // compute on the H100: CuTe's run-time indexing took ~39 instructions per element).
    static constexpr int Warps = Threads / 32;
    static constexpr int Cw = EpiN / 32;                 // columns per lane
    static constexpr int Rw = Warps > 0 ? EpiM / Warps : 0;  // rows per warp
    static constexpr bool Fast = Threads % 32 == 0 && EpiN % 32 == 0 && Warps > 0 && EpiM % (8 * Warps) == 0;

    CUTLASS_DEVICE ConsumerStoreCallbacks(RTensor&& tC_rAux, TiledR2S tiled_r2s, STensorR2S&& tRS_sAux, STensor sAux,
                                          ProblemShapeMNL problem_shape_mnl, TileOrigin origin, Params const* params_ptr,
                                          int thread_idx)
        : tiled_r2s(tiled_r2s), tC_rAux(cute::forward<RTensor>(tC_rAux)), tRS_sAux(cute::forward<STensorR2S>(tRS_sAux)),
          sAux(sAux), problem_shape_mnl(problem_shape_mnl), origin(origin), params_ptr(params_ptr),
          thread_idx(thread_idx) {}

    TiledR2S tiled_r2s;
    RTensor tC_rAux;             // (CPY,CPY_M,CPY_N)
    STensorR2S tRS_sAux;         // (R2S,R2S_M,R2S_N,PIPE)
    STensor sAux;                // (EPI_TILE_M,EPI_TILE_N,PIPE)
    ProblemShapeMNL problem_shape_mnl;
    TileOrigin origin;           // (first row, first column, batch) of the CTA tile
    Params const* params_ptr;
    int thread_idx;              // among the epilogue threads (0 .. Threads)

    template <typename ElementAccumulator, typename ElementInput, int FragmentSize>
    CUTLASS_DEVICE auto
    visit(cutlass::Array<ElementAccumulator, FragmentSize> const&, int epi_v, int, int,
          cutlass::Array<ElementInput, FragmentSize> const& frg_input) {
      cutlass::NumericArrayConverter<Element, ElementInput, FragmentSize, RoundStyle> convert;
      cute::Tensor frg = cute::recast<cutlass::Array<Element, FragmentSize>>(cute::coalesce(tC_rAux));
      frg(epi_v) = convert(frg_input);
      return frg_input;
    }

    CUTLASS_DEVICE void
    postreduce(int, int, int store_iteration, bool issue_smem_store) {
      if (params_ptr->ptr_aux == nullptr) {
        return;
      }
      using RLayoutR2S = decltype(cute::layout(TiledR2S{}.get_slice(0).retile_S(RTensor{})));
      cute::Tensor tRS_rAux = cute::make_tensor(tC_rAux.data(), RLayoutR2S{});
      if (issue_smem_store) {
        cute::copy(tiled_r2s, tRS_rAux, tRS_sAux(cute::_, cute::_, cute::_, store_iteration % Stages));
      }
    }

    // every epilogue thread, after the barrier that makes the subtile visible (see the header)
    CUTLASS_DEVICE void
    tma_store(int epi_m, int epi_n, int store_iteration, bool) {
      if (params_ptr->ptr_aux == nullptr) {
        return;
      }
      auto [M, N, L] = problem_shape_mnl;
      int row0 = cute::get<0>(origin) + epi_m * EpiM;
      int col0 = cute::get<1>(origin) + epi_n * EpiN;
      int rows = cute::min(int(EpiM), int(M) - row0);
      int cols = cute::min(int(EpiN), int(N) - col0);
      if (rows <= 0 || cols <= 0) {
        return;
      }
      int64_t ld = cute::get<0>(params_ptr->dAux);
      Element* base = params_ptr->ptr_aux + int64_t(cute::get<2>(origin)) * int64_t(cute::get<2>(params_ptr->dAux)) +
                      int64_t(row0) * ld + col0;
      auto s = sAux(cute::_, cute::_, store_iteration % Stages);
      if constexpr (Fast) {
        if (params_ptr->fast) {
          copy_fast(store_iteration % Stages, base, ld, rows, cols);
          return;
        }
      }
      copy_rows(s, base, ld, rows, cols);
    }

    CUTLASS_DEVICE static Element
    load_shared(uint32_t addr) {
      if constexpr (Bytes == 4) {
        uint32_t x;
        asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(x) : "r"(addr));
        return reinterpret_cast<Element const&>(x);
      } else if constexpr (Bytes == 2) {
        uint16_t x;
        asm volatile("ld.shared.b16 %0, [%1];\n" : "=h"(x) : "r"(addr));
        return reinterpret_cast<Element const&>(x);
      } else {
        uint16_t x;
        asm volatile("ld.shared.u8 %0, [%1];\n" : "=h"(x) : "r"(addr));
        uint8_t b = uint8_t(x);
        return reinterpret_cast<Element const&>(b);
      }
    }

    // see Fast: the loads of Batch rows (independent), then their predicated stores
    CUTLASS_DEVICE void
    copy_fast(int stage, Element* base, int64_t ld, int rows, int cols) {
      constexpr int Batch = 4;
      static_assert(8 % Batch == 0, "a batch of rows inside an atom of 8");
      SmemLayoutPI L{};
      int warp = thread_idx / 32, lane = thread_idx % 32;
      int r0 = warp * Rw;
      uint32_t sb = cute::cast_smem_ptr_to_uint(cute::raw_pointer_cast(sAux.data())) +
                    uint32_t(int(L(r0, 0, 0)) + stage * int(L(0, 0, Stages > 1 ? 1 : 0))) * Bytes;
      uint32_t xlane[Cw];
      CUTLASS_PRAGMA_UNROLL
      for (int cw = 0; cw < Cw; ++cw) {
        xlane[cw] = uint32_t(int(L(0, lane + 32 * cw, 0)));
      }
      Element* g = base + int64_t(r0) * ld + lane;
      int nr = rows - r0;
      CUTLASS_PRAGMA_UNROLL
      for (int k0 = 0; k0 < Rw; k0 += Batch) {
        Element v[Batch][Cw];
        CUTLASS_PRAGMA_UNROLL
        for (int k = 0; k < Batch; ++k) {
          int r = k0 + k;  // static
          CUTLASS_PRAGMA_UNROLL
          for (int cw = 0; cw < Cw; ++cw) {
            uint32_t off = uint32_t(int(L(r - r % 8, 0, 0))) + (uint32_t(int(L(r % 8, 0, 0))) ^ xlane[cw]);
            v[k][cw] = load_shared(sb + off * Bytes);
          }
        }
        CUTLASS_PRAGMA_UNROLL
        for (int k = 0; k < Batch; ++k) {
          if (k0 + k < nr) {
            CUTLASS_PRAGMA_UNROLL
            for (int cw = 0; cw < Cw; ++cw) {
              if (lane + 32 * cw < cols) {
                g[32 * cw] = v[k][cw];
              }
            }
          }
          g += ld;
        }
      }
    }

    // the generic copy (a layout fast_layout() rejects, a subtile Fast doesn't cover): element
    // u of the subtile's rows x EpiN to thread u mod Threads, consecutive threads on
    // consecutive columns of a row
    template <class STensor2>
    CUTLASS_DEVICE void
    copy_rows(STensor2 const& s, Element* base, int64_t ld, int rows, int cols) {
      for (int u = thread_idx; u < rows * EpiN; u += Threads) {
        int r = u / EpiN, c = u % EpiN;
        if (c < cols) {
          base[int64_t(r) * ld + c] = s(r, c);
        }
      }
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto
  get_consumer_store_callbacks(cutlass::epilogue::fusion::detail::ConsumerStoreArgs<Args...> const& args) {
    using namespace cute;
    auto [M, N, K, L] = args.problem_shape_mnkl;
    auto [m, n, k, l] = args.tile_coord_mnkl;
    auto problem_shape_mnl = make_shape(M, N, L);
    Tensor mAux = make_tensor(make_gmem_ptr(params_ptr->ptr_aux), make_shape(M, N, L), params_ptr->dAux);
    Tensor tC_gAux = cutlass::epilogue::fusion::sm90_partition_for_epilogue<ReferenceSrc>(
        mAux, args.tile_shape_mnk, args.tile_coord_mnkl, args.epi_tile, args.tiled_copy, args.thread_idx);
    Tensor tC_rAux = make_tensor<Element>(take<0, 3>(shape(tC_gAux)));
    Tensor sAux_epi = as_position_independent_swizzle_tensor(make_tensor(make_smem_ptr(smem_aux), SmemLayout{}));
    auto tiled_r2s = conditional_return<ReferenceSrc>(make_tiled_copy_S(Copy_Atom<CopyOpR2S, Element>{}, args.tiled_copy),
                                                      make_tiled_copy_D(Copy_Atom<CopyOpR2S, Element>{}, args.tiled_copy));
    auto tRS_sAux = tiled_r2s.get_slice(args.thread_idx).partition_D(sAux_epi);  // (R2S,R2S_M,R2S_N,PIPE)
    auto origin = make_tuple(int(m) * int(size<0>(args.tile_shape_mnk)), int(n) * int(size<1>(args.tile_shape_mnk)), int(l));
    constexpr int Threads = decltype(size(args.tiled_mma))::value;
    return ConsumerStoreCallbacks<Threads, decltype(tC_rAux), decltype(tiled_r2s), decltype(tRS_sAux), decltype(sAux_epi),
                                  decltype(problem_shape_mnl), decltype(origin)>(
        cute::move(tC_rAux), tiled_r2s, cute::move(tRS_sAux), sAux_epi, problem_shape_mnl, origin, params_ptr,
        args.thread_idx);
  }
};

}  // namespace evtc
