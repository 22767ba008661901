// evtc: a persistent tile scheduler that visits the batches of one output tile one after another.
//
// NOTE [Batch-inner tile order] (evtc/runtime/phase_split.py, NOTE [Row-phase split]): CUTLASS's
// persistent scheduler (PersistentTileSchedulerSm90, static_tile_scheduler.hpp) maps a CTA's linear
// work index to (batch l, M tile, N tile) with the batch outermost: batch l + 1 starts when batch l
// is done. The row-phase split runs a packed M x N problem as G batched phases whose B operands are
// the same rows shifted by a few elements, so with the batch outermost every phase reads all of B
// from HBM again (G x 262 MB for a 32001 x 4096 bf16 B). This scheduler keeps CUTLASS's mapping and
// its tile swizzle, raster order and cluster handling, and only renumbers whole clusters' work: the
// base's cluster index f = l * (clusters per batch) + c becomes (l = f mod L, c = f / L), so the
// CTAs running at one time work on the L batches of the same few output tiles, and each B tile
// comes from HBM once and from L2 for the other phases. The CTAs of one cluster must agree on l:
// with raster along N they share the base's index b = c (their offsets come from
// block_id_in_cluster), with raster along M they differ in b's offset along the cluster's major
// extent, b = c * (cluster M) + offset, which is kept as it is (a first version renumbered b and
// sent a 2x1 cluster's two CTAs to different batches: wrong results on the H100).
//
// Selected by the tag evtc::BatchInnerScheduler (GemmConfig.scheduler = "batch_inner"); its
// Arguments, Params, grid and workspace are PersistentTileSchedulerSm90's.
#pragma once

#include <cutlass/gemm/kernel/sm90_tile_scheduler.hpp>
#include <cutlass/gemm/kernel/tile_scheduler.hpp>

namespace evtc {

struct BatchInnerScheduler {};

class BatchInnerTileSchedulerSm90 : public cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90 {
  using Base = cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90;
  // the base keeps its own copies private; these shadow them (same initial values and steps)
  uint64_t linear_idx_ = 0;
  uint64_t grid_size_ = 0;

 public:
  using Params = Base::Params;
  using Arguments = Base::Arguments;
  using WorkTileInfo = Base::WorkTileInfo;
  using Base::advance_to_next_work;
  using Base::fetch_next_work;

  CUTLASS_HOST_DEVICE BatchInnerTileSchedulerSm90() {}

  CUTLASS_DEVICE explicit BatchInnerTileSchedulerSm90(Params const& params) : Base(params) {
#if defined(__CUDA_ARCH__)
    if (params.raster_order_ == RasterOrder::AlongN) {
      linear_idx_ = uint64_t(blockIdx.x) + uint64_t(blockIdx.y) * uint64_t(gridDim.x);
    } else {
      linear_idx_ = uint64_t(blockIdx.x) * uint64_t(gridDim.y) + uint64_t(blockIdx.y);
    }
    grid_size_ = uint64_t(gridDim.x) * uint64_t(gridDim.y) * uint64_t(gridDim.z);
#endif
  }

  CUTLASS_DEVICE WorkTileInfo get_current_work_for_linear_idx(uint64_t linear_idx) const {
    Params const& p = scheduler_params;
    if (linear_idx >= p.blocks_per_problem_) {
      return WorkTileInfo::invalid_work_tile();
    }
    uint64_t l_base, remainder;
    p.divmod_batch_(l_base, remainder, linear_idx);
    uint64_t const b_base = p.divmod_cluster_shape_minor_.divide(remainder);
    // b_base = cluster * (cluster extent along the raster's major dimension) + the CTA's offset in
    // it (with raster along M, a cluster's CTAs differ there): renumber whole clusters only
    uint64_t cluster, major_offset;
    p.divmod_cluster_shape_major_(cluster, major_offset, b_base);
    uint64_t const clusters_per_batch =
        p.divmod_batch_.divisor / (p.divmod_cluster_shape_minor_.divisor * p.divmod_cluster_shape_major_.divisor);
    uint64_t const batches = p.blocks_per_problem_ / p.divmod_batch_.divisor;
    uint64_t const f = l_base * clusters_per_batch + cluster;
    uint64_t const c = f / batches;
    uint64_t const l = f - c * batches;
    uint64_t const b = c * p.divmod_cluster_shape_major_.divisor + major_offset;
    auto [m, n] = Base::get_work_idx_m_and_n(b, p.divmod_cluster_shape_major_, p.divmod_cluster_shape_minor_,
                                             p.divmod_cluster_blk_major_, p.log_swizzle_size_, p.raster_order_);
    return {m, n, static_cast<int32_t>(l), true};
  }

  template <class ClusterShape>
  CUTLASS_DEVICE WorkTileInfo initial_work_tile_info(ClusterShape) {
    return get_current_work();
  }

  CUTLASS_DEVICE WorkTileInfo get_current_work() const { return get_current_work_for_linear_idx(linear_idx_); }

  CUTLASS_DEVICE void advance_to_next_work(uint32_t advance_count = 1) {
    linear_idx_ += grid_size_ * uint64_t(advance_count);
  }

  CUTLASS_DEVICE bool is_last_tile(WorkTileInfo& work_tile_info, uint32_t advance_count = 1) const {
    if (Base::continue_current_work(work_tile_info)) {
      return false;
    }
    return not get_current_work_for_linear_idx(linear_idx_ + grid_size_ * uint64_t(advance_count)).is_valid();
  }

  CUTLASS_DEVICE auto fetch_next_work(WorkTileInfo work_tile_info) {
    if (Base::continue_current_work(work_tile_info)) {
      return cute::make_tuple(work_tile_info, true);
    }
    advance_to_next_work();
    return cute::make_tuple(get_current_work(), true);
  }

  template <class TileSchedulerPipeline, class TileSchedulerPipelineState>
  CUTLASS_DEVICE auto fetch_next_work(WorkTileInfo work_tile_info, TileSchedulerPipeline&,
                                      TileSchedulerPipelineState) {
    return fetch_next_work(work_tile_info);
  }
};

}  // namespace evtc

namespace cutlass::gemm::kernel::detail {

template <class ArchTag, class TileShape, class ClusterShape, uint32_t SchedulerPipelineStageCount>
struct TileSchedulerSelector<evtc::BatchInnerScheduler, ArchTag, TileShape, ClusterShape,
                             SchedulerPipelineStageCount> {
  using Scheduler = evtc::BatchInnerTileSchedulerSm90;
};

}  // namespace cutlass::gemm::kernel::detail
