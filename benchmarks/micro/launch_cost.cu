// Host cost of one kernel launch on this machine, by parameter size and launch API: the floor
// under evtc_launch (benchmarks/bench_host.py reports both). Build and run:
//   nvcc -O2 -std=c++17 -arch=sm_90a -o launch_cost benchmarks/micro/launch_cost.cu && ./launch_cost
#include <chrono>
#include <cstdio>
#include <cuda_runtime.h>

template <int Bytes>
struct Params {
  unsigned char data[Bytes];
};

template <int Bytes>
__global__ void empty_kernel_nocluster(__grid_constant__ const Params<Bytes> p) {
  if (p.data[0] == 123 && threadIdx.x == 1000) {
    printf("never\n");
  }
}

template <class F>
double time_us(F launch, int n) {
  for (int i = 0; i < 100; ++i) launch();
  cudaDeviceSynchronize();
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) launch();
  auto t1 = std::chrono::steady_clock::now();
  cudaDeviceSynchronize();
  return std::chrono::duration<double, std::micro>(t1 - t0).count() / n;
}

template <int Bytes>
void run(cudaStream_t stream, int smem) {
  Params<Bytes> p = {};
  cudaFuncSetAttribute(empty_kernel_nocluster<Bytes>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  cudaFuncSetAttribute(empty_kernel_nocluster<Bytes>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  double chevron = time_us([&] { empty_kernel_nocluster<Bytes><<<132, 384, smem, stream>>>(p); }, 2000);
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 2;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(132, 1, 1);
  cfg.blockDim = dim3(384, 1, 1);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  void* args[] = {&p};
  double cluster = time_us([&] {
    cudaLaunchKernelExC(&cfg, reinterpret_cast<void const*>(&empty_kernel_nocluster<Bytes>), args);
  }, 2000);
  int dev = 0;
  double get_device = time_us([&] { cudaGetDevice(&dev); }, 20000);
  printf("{\"param_bytes\": %d, \"smem\": %d, \"chevron_us\": %.2f, \"cluster2_us\": %.2f, \"cudaGetDevice_us\": %.3f, "
         "\"error\": \"%s\"}\n", Bytes, smem, chevron, cluster, get_device, cudaGetErrorString(cudaGetLastError()));
}

int main() {
  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  for (int smem : {0, 200 * 1024}) {
    run<64>(stream, smem);
    run<512>(stream, smem);
    run<1024>(stream, smem);
    run<2048>(stream, smem);
    run<4096>(stream, smem);
  }
  return 0;
}
