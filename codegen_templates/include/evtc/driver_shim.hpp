// CUTLASS's fill_workspace (cutlass/workspace.h, used to initialise atomic reductions with their
// identity) calls the CUDA driver API directly: cuMemsetD{8,16,32}Async and cuGetErrorString; and
// the sm90 template defines CUTLASS_ENABLE_DIRECT_CUDA_DRIVER_CALL so that the TMA descriptors
// (cute/atom/copy_traits_sm90_tma.hpp) call cuTensorMapEncodeTiled directly instead of looking
// its entry point up on every call (cutlass/cuda_host_adapter.hpp).
// Linking libcuda would make the library unloadable on a machine without a driver (evtc reads
// evtc_info there, e.g. in the compile tests), so these definitions resolve the driver's entry
// points at call time through the runtime (cudaGetDriverEntryPointByVersion). They are hidden
// (-fvisibility=hidden): references in this library bind to them, nothing else sees them.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <evtc/driver_entry.hpp>  // evtc::detail::driver_entry

extern "C" {
CUresult CUDAAPI cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t n, CUstream stream) {
  using Fn = CUresult(CUDAAPI*)(CUdeviceptr, unsigned char, size_t, CUstream);
  static Fn fn = evtc::detail::driver_entry<Fn>("cuMemsetD8Async", 3020);
  return fn ? fn(dst, value, n, stream) : CUDA_ERROR_NOT_FOUND;
}
CUresult CUDAAPI cuMemsetD16Async(CUdeviceptr dst, unsigned short value, size_t n, CUstream stream) {
  using Fn = CUresult(CUDAAPI*)(CUdeviceptr, unsigned short, size_t, CUstream);
  static Fn fn = evtc::detail::driver_entry<Fn>("cuMemsetD16Async", 3020);
  return fn ? fn(dst, value, n, stream) : CUDA_ERROR_NOT_FOUND;
}
CUresult CUDAAPI cuMemsetD32Async(CUdeviceptr dst, unsigned int value, size_t n, CUstream stream) {
  using Fn = CUresult(CUDAAPI*)(CUdeviceptr, unsigned int, size_t, CUstream);
  static Fn fn = evtc::detail::driver_entry<Fn>("cuMemsetD32Async", 3020);
  return fn ? fn(dst, value, n, stream) : CUDA_ERROR_NOT_FOUND;
}
CUresult CUDAAPI cuTensorMapEncodeTiled(CUtensorMap* tensorMap, CUtensorMapDataType tensorDataType,
                                        cuuint32_t tensorRank, void* globalAddress, cuuint64_t const* globalDim,
                                        cuuint64_t const* globalStrides, cuuint32_t const* boxDim,
                                        cuuint32_t const* elementStrides, CUtensorMapInterleave interleave,
                                        CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2Promotion,
                                        CUtensorMapFloatOOBfill oobFill) {
  using Fn = CUresult(CUDAAPI*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, cuuint64_t const*,
                                cuuint64_t const*, cuuint32_t const*, cuuint32_t const*, CUtensorMapInterleave,
                                CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
  static Fn fn = evtc::detail::driver_entry<Fn>("cuTensorMapEncodeTiled", 12000);
  return fn ? fn(tensorMap, tensorDataType, tensorRank, globalAddress, globalDim, globalStrides, boxDim, elementStrides,
                 interleave, swizzle, l2Promotion, oobFill)
            : CUDA_ERROR_NOT_FOUND;
}
CUresult CUDAAPI cuGetErrorString(CUresult error, char const** str) {
  using Fn = CUresult(CUDAAPI*)(CUresult, char const**);
  static Fn fn = evtc::detail::driver_entry<Fn>("cuGetErrorString", 6000);
  return fn ? fn(error, str) : CUDA_ERROR_NOT_FOUND;
}
}
