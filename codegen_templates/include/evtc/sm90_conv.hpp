// evtc's pieces of the sm90 implicit-GEMM convolution (CUTLASS 3.x ConvUniversal): the collective
// epilogue seen through the flattened GEMM problem, and the CUDA driver's im2col TMA encoder.
//
// NOTE [The conv epilogue sees a GEMM]
// CUTLASS's sm90 conv kernel (conv/kernel/sm90_implicit_gemm_tma_warpspecialized.hpp: a
// GemmUniversal over KernelTmaWarpSpecialized) hands the collective epilogue a problem shape
// whose modes are nested (conv/detail.hpp, get_transformed_problem_shape_MNKL): on the host
// M = (Q,P,Z,N) for fprop and (W,H,D,N) for dgrad, N = (C,S,R,T) for wgrad, K nested, L = (V,U,O)
// for dgrad; on the device M is linearized but wgrad's N stays nested. Stock TMA aux visitors
// can't tile a nested M (make_tma_copy: "Could not find a common tile-gmem vectorization"), and
// row broadcasts and reductions index a flat (M, N, L) tensor.
//
// evtc's convolution tensors are packed: the output (NZPQK for fprop, NDHWC for dgrad, KTRSC for
// wgrad) is M rows of N contiguous elements, row m at m * ld, and the kernel's tiles and the
// mainloop's im2col order walk M and N in exactly that flattened order (q fastest, then p, z, n;
// c fastest, then s, r, t: the colexicographic order of the nested modes, which is how
// local_tile divides a nested mode). So the epilogue sees the flat GEMM (M = product of the
// modes, N likewise, L = 1), with the GEMM's row-major stride (ld, _1, batch) for C, D and every
// aux tensor: Sm90ConvEpilogue wraps the stock collective and flattens the problem shape in
// every entry point that takes one (host: to_underlying_arguments, can_implement and the
// workspace calls; device: load, store, with the CTA tile's coordinate and shape flattened too:
// wgrad's tile coordinate along the nested N is nested). Everything the visitor tree does is then what it does in
// the GEMM of the same M, N, and evtc's shared-memory planner applies unchanged.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>

#include <evtc/driver_entry.hpp>  // evtc::detail::driver_entry

namespace evtc {

// (M, N, K, L) with each mode the product of its (possibly nested) extents, as int.
template <class ProblemShape>
CUTLASS_HOST_DEVICE auto flat_problem_shape(ProblemShape const& problem_shape) {
  auto mnkl = cute::append<4>(problem_shape, cute::Int<1>{});
  return cute::make_shape(static_cast<int>(cute::product(cute::get<0>(mnkl))),
                          static_cast<int>(cute::product(cute::get<1>(mnkl))),
                          static_cast<int>(cute::product(cute::get<2>(mnkl))),
                          static_cast<int>(cute::product(cute::get<3>(mnkl))));
}

// The index of a CTA tile along one mode in the flat problem. The kernel tiles a nested mode (wgrad's
// N = (C,S,R,T)) with local_tile, whose tile grid is shape_div(extent, block) and whose tile
// coordinate is nested; its colexicographic index is the flat tile index when the first extent
// is a multiple of the block (C % BLK_N == 0, which evtc checks), so both tilings cover the same
// elements.
template <class Extent, class Block, class Coord>
CUTLASS_HOST_DEVICE auto flat_tile_index(Extent const& extent, Block const& block, Coord const& coord) {
  if constexpr (cute::is_tuple<Coord>::value) {
    return static_cast<int>(cute::crd2idx(coord, cute::shape_div(extent, block)));
  } else {
    return coord;
  }
}

template <class ProblemShapeMNKL, class TileShapeMNK, class TileCoordMNKL>
CUTLASS_HOST_DEVICE auto flat_tile_coord(ProblemShapeMNKL const& problem_shape_mnkl, TileShapeMNK const& tile_shape,
                                         TileCoordMNKL const& tile_coord) {
  return cute::make_coord(
      flat_tile_index(cute::get<0>(problem_shape_mnkl), cute::size<0>(tile_shape), cute::get<0>(tile_coord)),
      flat_tile_index(cute::get<1>(problem_shape_mnkl), cute::size<1>(tile_shape), cute::get<1>(tile_coord)),
      cute::get<2>(tile_coord), cute::get<3>(tile_coord));
}

// The CTA tile as a flat (M, N, K) shape (wgrad's mainloop tile nests its N and K modes).
template <class TileShapeMNK>
CUTLASS_HOST_DEVICE auto flat_tile_shape(TileShapeMNK const&) {
  return cute::make_shape(cute::Int<cute::size<0>(TileShapeMNK{})>{}, cute::Int<cute::size<1>(TileShapeMNK{})>{},
                          cute::Int<cute::size<2>(TileShapeMNK{})>{});
}

// A stock sm90 collective epilogue (Base) that always sees the flat problem shape (NOTE [The conv
// epilogue sees a GEMM]). Types, storage, pipelines and the constructor are Base's.
template <class Base>
struct Sm90ConvEpilogue : Base {
  using Base::Base;
  using Arguments = typename Base::Arguments;
  using Params = typename Base::Params;

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const& problem_shape, Arguments const& args,
                                                  void* workspace) {
    return Base::to_underlying_arguments(flat_problem_shape(problem_shape), args, workspace);
  }

  template <class ProblemShape>
  static size_t get_workspace_size(ProblemShape const& problem_shape, Arguments const& args) {
    return Base::get_workspace_size(flat_problem_shape(problem_shape), args);
  }

  template <class ProblemShape>
  static cutlass::Status initialize_workspace(ProblemShape const& problem_shape, Arguments const& args,
                                              void* workspace, cudaStream_t stream,
                                              cutlass::CudaHostAdapter* cuda_adapter = nullptr) {
    return Base::initialize_workspace(flat_problem_shape(problem_shape), args, workspace, stream, cuda_adapter);
  }

  template <class ProblemShape>
  static bool can_implement(ProblemShape const& problem_shape, Arguments const& args) {
    return Base::can_implement(flat_problem_shape(problem_shape), args);
  }

  // load(load_pipeline, load_state, problem_shape_mnkl, tile_shape, tile_coord, tiled_mma, thread_idx,
  //      shared_tensors[, subtile_idx]) (sm90_epilogue_tma_warpspecialized.hpp)
  template <class LoadPipeline, class LoadState, class ProblemShapeMNKL, class TileShapeMNK, class TileCoordMNKL,
            class... Rest>
  CUTLASS_DEVICE auto load(LoadPipeline load_pipeline, LoadState load_state, ProblemShapeMNKL problem_shape_mnkl,
                           TileShapeMNK tile_shape, TileCoordMNKL tile_coord, Rest&&... rest) {
    return Base::load(load_pipeline, load_state, flat_problem_shape(problem_shape_mnkl), flat_tile_shape(tile_shape),
                      flat_tile_coord(problem_shape_mnkl, tile_shape, tile_coord), static_cast<Rest&&>(rest)...);
  }

  // store(load_pipeline, load_state, store_pipeline, store_state, problem_shape_mnkl, tile_shape,
  //       tile_coord, accumulators, tiled_mma, thread_idx, shared_tensors[, subtile_idx])
  template <class LoadPipeline, class LoadState, class StorePipeline, class StoreState, class ProblemShapeMNKL,
            class TileShapeMNK, class TileCoordMNKL, class... Rest>
  CUTLASS_DEVICE auto store(LoadPipeline load_pipeline, LoadState load_state, StorePipeline store_pipeline,
                            StoreState store_state, ProblemShapeMNKL problem_shape_mnkl, TileShapeMNK tile_shape,
                            TileCoordMNKL tile_coord, Rest&&... rest) {
    return Base::store(load_pipeline, load_state, store_pipeline, store_state, flat_problem_shape(problem_shape_mnkl),
                       flat_tile_shape(tile_shape), flat_tile_coord(problem_shape_mnkl, tile_shape, tile_coord),
                       static_cast<Rest&&>(rest)...);
  }
};

// NOTE [Persistent conv kernels]
// CUTLASS's sm90 conv kernel is the non-persistent one-consumer-warpgroup GemmUniversal
// (KernelTmaWarpSpecialized): one output tile per CTA, no tile scheduler, so a layer whose tiles
// don't fill whole waves of SMs, or whose K loop is long over few tiles, has no remedy there
// (conv/dispatch_policy.hpp static_asserts the conv schedules Cooperative and Pingpong away). The
// conv collective mainloop itself (conv/collective/sm90_implicit_gemm_gmma_ss_warpspecialized.hpp)
// has the GEMM collective's interface (load_init, load, load_tail, mma, mma_tail over a K-tile
// iterator and count, any TiledMma), so Sm90ConvMainloopAsGemm adapts it to CUTLASS's GEMM
// kernels: the persistent cooperative kernel (two consumer warpgroups, a 128x256 tile) over the
// persistent or the stream-K tile scheduler (split-K and stream-K with the reduction before the
// epilogue), which the GEMMs use. What it adapts:
//  * the kernel's problem shape is the flat GEMM (M, N, K, 1) (the tile scheduler counts tiles and
//    K tiles in it); the mainloop's Arguments carry the ConvProblemShape, from which its TMA
//    im2col descriptors and the linearized (M, N, nested K, L) shape of its tile views are made
//    (Params keeps the latter for load_init);
//  * the GEMM kernel indexes a batch mode L of B's tile view (shape<4>(gB_nkl)): load_init appends
//    a mode of extent 1 to B's view (fprop's and dgrad's filter, a plain tiled TMA view; A's im2col
//    view has a composed layout, which the kernel only tiles along m and k) and load drops it
//    again (wgrad, whose B is the im2col operand, stays on the conv kernel);
//  * the kernel static_asserts rank-3 StrideA/StrideB, which only the collective uses: the adapter
//    names GEMM strides for the kernel, the collective keeps its own;
//  * the kernel counts producer arrivals by NumProducerThreadEvents (1: one elected thread issues
//    the TMA loads, as in the GEMM collective).
// The K tiles must agree: the scheduler's ceil(K / BLK_K) of the flat K and the mainloop's nested
// K-tile grid (channels / BLK_K x filter taps) are equal when the channels are a multiple of BLK_K,
// which can_implement checks (evtc's heuristic sends other problems to the non-persistent kernel),
// with dgrad's stride phases L = 1 (unit stride).
// The epilogue is the same collective epilogue, which sees the flat GEMM either way (NOTE [The
// conv epilogue sees a GEMM]).
template <class Conv>
struct Sm90ConvMainloopAsGemm : Conv {
  using ConvProblemShape = typename Conv::ProblemShape;
  using ConvShapeMNKL = decltype(Conv::get_problem_shape_MNKL(ConvProblemShape{}));
  // the kernel's static_asserts only (the collective's own strides stay Conv::StrideA/StrideB)
  using StrideA = cute::Stride<int64_t, cute::_1, int64_t>;
  using StrideB = cute::Stride<int64_t, cute::_1, int64_t>;
  static constexpr int NumProducerThreadEvents = 1;

  struct Arguments : Conv::Arguments {
    ConvProblemShape problem{};
  };
  struct Params : Conv::Params {
    ConvShapeMNKL problem_mnkl{};
  };

  // The flat GEMM problem (M, N, K, 1) of a convolution, for the kernel's Arguments.
  static cute::Shape<int, int, int, int> gemm_problem_shape(ConvProblemShape const& problem) {
    return flat_problem_shape(Conv::get_problem_shape_MNKL(problem));
  }

  template <class GemmShape>
  static Params to_underlying_arguments(GemmShape const&, Arguments const& args, void* workspace) {
    Params params;
    static_cast<typename Conv::Params&>(params) = Conv::to_underlying_arguments(args.problem, args, workspace);
    params.problem_mnkl = Conv::get_problem_shape_MNKL(args.problem);
    return params;
  }

  template <class GemmShape>
  static bool can_implement(GemmShape const& gemm_shape, Arguments const& args) {
    auto mnkl = Conv::get_problem_shape_MNKL(args.problem);
    constexpr int BlkK = cute::size<2>(typename Conv::TileShape{});
    // the mainloop's K-tile grid (the innermost, channel, mode divided by BLK_K, times the other
    // modes) is the scheduler's ceil(K / BLK_K) when the channels are a multiple of BLK_K
    bool same_k_tiles = static_cast<int>(cute::front(cute::get<2>(mnkl))) % BlkK == 0 &&
                        cute::get<2>(gemm_shape) == static_cast<int>(cute::product(cute::get<2>(mnkl)));
    bool same_mn = cute::get<0>(gemm_shape) == static_cast<int>(cute::product(cute::get<0>(mnkl))) &&
                   cute::get<1>(gemm_shape) == static_cast<int>(cute::product(cute::get<1>(mnkl)));
    // one GEMM: dgrad's L (its stride phases) must be 1 (strided dgrad runs on evtc's sm80 kernel)
    bool one_batch = cute::product(cute::get<3>(mnkl)) == 1;
    return same_k_tiles && same_mn && one_batch && Conv::can_implement(args.problem, args);
  }

  template <class ProblemShapeMNKL>
  CUTLASS_DEVICE auto load_init(ProblemShapeMNKL const&, Params const& params) {
    auto views = Conv::load_init(params.problem_mnkl, params);
    // B (the filter, a tiled TMA view) gets the batch mode the kernel indexes; A (the
    // im2col view, a composed layout) is only tiled along m and k by the kernel
    auto const& gB = cute::get<1>(views);
    auto gB_l = cute::make_tensor(gB.data(), cute::make_layout(cute::append(gB.shape(), cute::_1{}),
                                                                cute::append(gB.stride(), cute::_0{})));
    return cute::make_tuple(cute::get<0>(views), gB_l);
  }

  template <class TensorA, class TensorB, class KTileIterator, class BlockCoord>
  CUTLASS_DEVICE void load(typename Conv::Params const& params, typename Conv::MainloopPipeline pipeline,
                           typename Conv::PipelineState state, cute::tuple<TensorA, TensorB> const& views,
                           BlockCoord const& blk_coord, KTileIterator k_tile_iter, int k_tile_count, int thread_idx,
                           uint32_t block_rank_in_cluster, typename Conv::TensorStorage& shared_tensors) {
    using cute::_;
    auto gB = cute::get<1>(views)(_, _, _, _, 0);
    Conv::load(params, pipeline, state, cute::make_tuple(cute::get<0>(views), gB), blk_coord, k_tile_iter, k_tile_count, thread_idx,
               block_rank_in_cluster, shared_tensors);
  }
};

}  // namespace evtc

// The im2col TMA descriptors of the conv mainloop (cute/atom/copy_traits_sm90_im2col.hpp) call
// the driver's cuTensorMapEncodeIm2col directly under CUTLASS_ENABLE_DIRECT_CUDA_DRIVER_CALL; as
// for the other driver calls (evtc/driver_shim.hpp: the library must load without a driver),
// the definition resolves the entry point at call time through the runtime.
extern "C" {
CUresult CUDAAPI cuTensorMapEncodeIm2col(CUtensorMap* tensorMap, CUtensorMapDataType tensorDataType,
                                         cuuint32_t tensorRank, void* globalAddress, cuuint64_t const* globalDim,
                                         cuuint64_t const* globalStrides, int const* pixelBoxLowerCorner,
                                         int const* pixelBoxUpperCorner, cuuint32_t channelsPerPixel,
                                         cuuint32_t pixelsPerColumn, cuuint32_t const* elementStrides,
                                         CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
                                         CUtensorMapL2promotion l2Promotion, CUtensorMapFloatOOBfill oobFill) {
  using Fn = CUresult(CUDAAPI*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, cuuint64_t const*,
                                cuuint64_t const*, int const*, int const*, cuuint32_t, cuuint32_t, cuuint32_t const*,
                                CUtensorMapInterleave, CUtensorMapSwizzle, CUtensorMapL2promotion,
                                CUtensorMapFloatOOBfill);
  static Fn fn = evtc::detail::driver_entry<Fn>("cuTensorMapEncodeIm2col", 12000);
  return fn ? fn(tensorMap, tensorDataType, tensorRank, globalAddress, globalDim, globalStrides, pixelBoxLowerCorner,
                 pixelBoxUpperCorner, channelsPerPixel, pixelsPerColumn, elementStrides, interleave, swizzle,
                 l2Promotion, oobFill)
            : CUDA_ERROR_NOT_FOUND;
}
}
