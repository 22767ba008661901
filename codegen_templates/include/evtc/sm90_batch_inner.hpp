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
// NOTE [No 64-bit division in the scheduler]: every warp maps its next tile through
// get_current_work_for_linear_idx. A first version divided in 64 bits there, which nvcc compiles to
// a call of a division subroutine; in the aux-heavy ping-pong kernel (168 registers, already
// spilling) that cost 43 % more local-memory reloads than CUTLASS's scheduler and 4 % of the time at
// L = 1, where the two map every tile alike (Nsight Compute, H100, 2048 x 32008 x 4096: 0.920
// against 0.883 ms, 6.1 against 4.3 MB of local loads). Without it the kernel spills nothing at
// all (0 bytes of local loads and stores; 0.896 against CUTLASS's order's 0.887 ms), and the
// row-phase split of aux_heavy at 2048 x 32001 x 4096 went from 1.19 to 1.11x the aligned time.
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
    // no 64-bit division here (NOTE [No 64-bit division in the scheduler]): the cluster extents are
    // powers of two (shifts), the batch count comes from the base's multiply-high divmod, and the
    // one division left is 32-bit (cluster counts are far below 2^32)
    uint32_t const clusters_per_batch = static_cast<uint32_t>(
        p.divmod_cluster_shape_major_.divide(p.divmod_cluster_shape_minor_.divide(p.divmod_batch_.divisor)));
    uint32_t const batches = static_cast<uint32_t>(p.divmod_batch_.divide(p.blocks_per_problem_));
    uint32_t const f = static_cast<uint32_t>(l_base) * clusters_per_batch + static_cast<uint32_t>(cluster);
    uint32_t const c = f / batches;
    uint32_t const l = f - c * batches;
    uint64_t const b = uint64_t(c) * p.divmod_cluster_shape_major_.divisor + major_offset;
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
