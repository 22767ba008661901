// evtc::detail::driver_entry: a CUDA driver function resolved at call time through the runtime
// (cudaGetDriverEntryPointByVersion), so a library that calls it needs no -lcuda and loads on a
// machine without a driver. Header-only (a template): safe to include in many translation units
// (evtc/driver_shim.hpp's definitions, evtc/sm90_reductions.hpp's fill, plugin consumers).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

namespace evtc::detail {
template <class Fn>
Fn driver_entry(char const* name, unsigned version) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status;
  if (cudaGetDriverEntryPointByVersion(name, &fn, version, cudaEnableDefault, &status) != cudaSuccess ||
      status != cudaDriverEntryPointSuccess) {
    return nullptr;
  }
  return reinterpret_cast<Fn>(fn);
}
}  // namespace evtc::detail
