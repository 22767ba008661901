// A hand-written CUTLASS 3.x Hopper GEMM whose epilogues are evtc fragments.
//
// Nothing here is generated: this file is what a CUDA programmer writes around CUTLASS, with its
// own tile, cluster and schedule, its own mainloop (CUTLASS's CollectiveBuilder), its own kernel
// (GemmUniversal) and its own host code and C ABI. Only the epilogues come from evtc, as two
// fragment headers made for this GEMM's configuration (build.py runs, for each,
//
//   evtc emit examples/epilogues.py:bias_relu --fragment --name BiasRelu --namespace hopper_example \
//        --tile 128x128x64 --cluster 2x1 --schedule cooperative --a bf16 --d bf16 -o bias_relu_fragment.h
//
// through evtc.plugin.lower). Both live in this one translation unit. The collective epilogue of
// each GEMM is built from its fragment's planned parameters (docs/plugin.md, "Using a fragment in
// C++"), and the static_asserts below refuse a fragment made for another configuration.
//
// C ABI (every function returns 0 on success, else one of the HOPPER_* codes below; nothing
// throws):
//   hopper_bias_relu(M, N, K, L, A, lda, bsA, B, ldb, bsB, C, ldc, bsC, D, ldd, bsD, bias, bs_bias,
//                    alpha, beta, stream)
//       D = relu(alpha * A B^T + beta * C + bias[n])
//   hopper_gelu_aux_colsum(M, N, K, L, A, lda, bsA, B, ldb, bsB, D, ldd, bsD, F, ldf, bsF, bias,
//                          bs_bias, col_sum, bs_col_sum, stream)
//       F = A B^T + bias[n] (aux store), D = gelu(F), col_sum[n] = sum over m of F
//   hopper_info(which, out[3]): sizeof(CollectiveEpilogue::SharedStorage), the mainloop's stages
//       and sizeof(GemmKernel::SharedStorage) of GEMM `which` (0: bias_relu, 1: gelu_aux_colsum)
// A is (L, M, K) row-major, B is (L, N, K) row-major (a column-major K x N operand), M x N tensors
// (L, M, N) row-major; ld* are row strides and bs* batch strides, in elements (0: one tensor for
// every batch). Rows start on 16-byte boundaries (TMA); N and K are multiples of 8.

#include <cstdint>
#include <cuda_runtime.h>

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/kernel_hardware_info.h>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/gemm/kernel/tile_scheduler.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>

#include "bias_relu_fragment.h"        // hopper_example::BiasRelu
#include "gelu_aux_colsum_fragment.h"  // hopper_example::GeluAuxColsum

// Once per library: the CUDA driver functions CUTLASS calls directly (TMA descriptors, filling
// reduction outputs with their identity), resolved at run time, so the library needs no -lcuda.
#include <evtc/driver_shim.hpp>

#define HOPPER_EXPORT extern "C" __attribute__((visibility("default")))

enum HopperStatus {
  HOPPER_OK = 0,
  HOPPER_CANNOT_IMPLEMENT = 1,  // CUTLASS's can_implement refused the problem (alignment, sizes)
  HOPPER_WORKSPACE = 2,         // the workspace could not be allocated
  HOPPER_INITIALIZE = 3,        // workspace initialisation or kernel parameters failed
  HOPPER_LAUNCH = 4,            // the launch failed
  HOPPER_BAD_ARGUMENT = 5,      // an argument of hopper_info is out of range
};

namespace hopper_example {

// ---- this GEMM's configuration --------------------------------------------------------------
using ElementA = cutlass::bfloat16_t;
using ElementB = cutlass::bfloat16_t;
using ElementAccumulator = float;
constexpr int AlignmentA = 8;  // 16 bytes of bf16
constexpr int AlignmentB = 8;
using TileShape = cute::Shape<cute::_128, cute::_128, cute::_64>;
using ClusterShape = cute::Shape<cute::_2, cute::_1, cute::_1>;
using KernelSchedule = cutlass::gemm::KernelTmaWarpSpecializedCooperative;

template <class Fragment>
struct HopperGemm {
  // The fragment must be one made for this GEMM (evtc.plugin.lower(..., tile=, schedule=, a=, b=)).
  static_assert(Fragment::kFragmentVersion == 1, "this GEMM is written against evtc fragment version 1");
  static_assert(cute::is_same_v<typename Fragment::TileShape, TileShape>, "the fragment was planned for another tile");
  static_assert(cute::is_same_v<typename Fragment::KernelSchedule, KernelSchedule>,
                "the fragment was planned for another kernel schedule");
  static_assert(cute::is_same_v<typename Fragment::ElementA, ElementA> && cute::is_same_v<typename Fragment::ElementB, ElementB>,
                "the fragment was planned for other operand types (they size the mainloop)");

  // The collective epilogue, from the fragment's planned parameters (cutlass/epilogue/collective/
  // sm90_epilogue_tma_warpspecialized.hpp: dispatch policy, CTA tile, epilogue tile, C, D, the
  // fusion callbacks, then the TMA and shared-memory copy operations and layouts).
  using CollectiveEpilogue = cutlass::epilogue::collective::CollectiveEpilogue<
      cutlass::epilogue::Sm90TmaWarpSpecialized<Fragment::StagesC, Fragment::StagesD, Fragment::FragmentSize,
                                                Fragment::ReuseSmemC, Fragment::DelayTmaStore>,
      TileShape,
      typename Fragment::EpilogueTile,
      typename Fragment::ElementC, typename Fragment::StrideC,
      typename Fragment::ElementD, typename Fragment::StrideD,
      typename Fragment::FusionCallbacks,
      cute::SM90_TMA_LOAD, typename Fragment::SmemLayoutAtomC, typename Fragment::CopyOpS2R,
      cute::SM90_TMA_STORE, typename Fragment::SmemLayoutAtomD, typename Fragment::CopyOpR2S,
      typename Fragment::CopyAtomC,
      void>;
  static_assert(sizeof(typename CollectiveEpilogue::SharedStorage) == Fragment::SharedStorageBytes,
                "the collective epilogue's shared storage is not what evtc planned");

  // This GEMM's mainloop: every stage that fits beside the epilogue's shared memory.
  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
      ElementA, cutlass::layout::RowMajor, AlignmentA,
      ElementB, cutlass::layout::ColumnMajor, AlignmentB,
      ElementAccumulator,
      TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;
  static_assert(CollectiveMainloop::DispatchPolicy::Stages == Fragment::MainloopStages,
                "the mainloop has another stage count than evtc planned beside the epilogue");

  using GemmKernel = cutlass::gemm::kernel::GemmUniversal<
      cute::Shape<int, int, int, int>, CollectiveMainloop, CollectiveEpilogue, cutlass::gemm::PersistentScheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;
  using StrideA = typename GemmKernel::StrideA;
  using StrideB = typename GemmKernel::StrideB;

  // One GEMM on `stream`: can_implement, a workspace (stream-ordered), initialize, run.
  static int run(int M, int N, int K, int L, void const* A, int64_t lda, int64_t bsA, void const* B, int64_t ldb,
                 int64_t bsB, typename Fragment::Params const& epilogue, cudaStream_t stream) {
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess) {
      return HOPPER_LAUNCH;
    }
    cutlass::KernelHardwareInfo hw_info;
    hw_info.device_id = device;
    hw_info.sm_count = cutlass::KernelHardwareInfo::query_device_multiprocessor_count(device);
    typename Gemm::Arguments arguments{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {M, N, K, L},
        {static_cast<ElementA const*>(A), StrideA{lda, cute::_1{}, bsA},
         static_cast<ElementB const*>(B), StrideB{ldb, cute::_1{}, bsB}},
        Fragment::arguments(epilogue),  // CollectiveEpilogue::Arguments, from the fragment's Params
        hw_info};
    Gemm gemm;
    if (Gemm::can_implement(arguments) != cutlass::Status::kSuccess) {
      return HOPPER_CANNOT_IMPLEMENT;
    }
    size_t workspace_bytes = Gemm::get_workspace_size(arguments);
    void* workspace = nullptr;
    if (workspace_bytes > 0 && cudaMallocAsync(&workspace, workspace_bytes, stream) != cudaSuccess) {
      cudaGetLastError();
      return HOPPER_WORKSPACE;
    }
    int status = HOPPER_OK;
    if (gemm.initialize(arguments, workspace, stream) != cutlass::Status::kSuccess) {
      status = HOPPER_INITIALIZE;
    } else if (gemm.run(stream) != cutlass::Status::kSuccess || cudaGetLastError() != cudaSuccess) {
      status = HOPPER_LAUNCH;
    }
    if (workspace != nullptr) {
      cudaFreeAsync(workspace, stream);
    }
    return status;
  }

  static void info(long long* out) {
    out[0] = static_cast<long long>(sizeof(typename CollectiveEpilogue::SharedStorage));
    out[1] = CollectiveMainloop::DispatchPolicy::Stages;
    out[2] = static_cast<long long>(sizeof(typename GemmKernel::SharedStorage));
  }
};

}  // namespace hopper_example

// ---- the C ABI ----------------------------------------------------------------------------------

HOPPER_EXPORT int hopper_bias_relu(int M, int N, int K, int L, void const* A, int64_t lda, int64_t bsA, void const* B,
                                   int64_t ldb, int64_t bsB, void const* C, int64_t ldc, int64_t bsC, void* D,
                                   int64_t ldd, int64_t bsD, void const* bias, int64_t bs_bias, float alpha,
                                   float beta, void* stream) {
  using Fragment = hopper_example::BiasRelu;
  Fragment::Params epilogue;  // the fragment's run-time parameters, by name (see its header)
  epilogue.p_C = C;
  epilogue.ld_C = ldc;
  epilogue.bs_C = bsC;
  epilogue.s_alpha = alpha;
  epilogue.s_beta = beta;
  epilogue.p_bias = bias;
  epilogue.bs_bias = bs_bias;
  epilogue.p_D = D;
  epilogue.ld_D = ldd;
  epilogue.bs_D = bsD;
  return hopper_example::HopperGemm<Fragment>::run(M, N, K, L, A, lda, bsA, B, ldb, bsB, epilogue,
                                                   static_cast<cudaStream_t>(stream));
}

HOPPER_EXPORT int hopper_gelu_aux_colsum(int M, int N, int K, int L, void const* A, int64_t lda, int64_t bsA,
                                         void const* B, int64_t ldb, int64_t bsB, void* D, int64_t ldd, int64_t bsD,
                                         void* F, int64_t ldf, int64_t bsF, void const* bias, int64_t bs_bias,
                                         void* col_sum, int64_t bs_col_sum, void* stream) {
  using Fragment = hopper_example::GeluAuxColsum;
  Fragment::Params epilogue;
  epilogue.p_bias = bias;
  epilogue.bs_bias = bs_bias;
  epilogue.p_D = D;
  epilogue.ld_D = ldd;
  epilogue.bs_D = bsD;
  epilogue.p_F = F;
  epilogue.ld_F = ldf;
  epilogue.bs_F = bsF;
  epilogue.p_col_sum = col_sum;
  epilogue.bs_col_sum = bs_col_sum;
  return hopper_example::HopperGemm<Fragment>::run(M, N, K, L, A, lda, bsA, B, ldb, bsB, epilogue,
                                                   static_cast<cudaStream_t>(stream));
}

HOPPER_EXPORT int hopper_info(int which, long long* out) {
  if (which == 0) {
    hopper_example::HopperGemm<hopper_example::BiasRelu>::info(out);
  } else if (which == 1) {
    hopper_example::HopperGemm<hopper_example::GeluAuxColsum>::info(out);
  } else {
    return HOPPER_BAD_ARGUMENT;
  }
  return HOPPER_OK;
}
