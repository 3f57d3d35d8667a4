#include "Roofline.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

namespace
{

// Eight independent FMA chains per thread keep the pipes full; the result is stored so the
// compiler cannot drop the work.
__global__ void fmaChains(float* out, int iterations, float a, float b)
{
  float x[8];
  for (int k = 0; k < 8; ++k)
  {
    x[k] = threadIdx.x * 1e-3f + k;
  }
  for (int i = 0; i < iterations; ++i)
  {
#pragma unroll
    for (int k = 0; k < 8; ++k)
    {
      x[k] = fmaf(x[k], a, b);
    }
  }
  float sum = 0;
  for (int k = 0; k < 8; ++k)
  {
    sum += x[k];
  }
  out[blockIdx.x * blockDim.x + threadIdx.x] = sum;
}

float medianOf(std::vector<float> v)
{
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

} // namespace

RooflineMeasurement measureRoofline()
{
  RooflineMeasurement m;
  const size_t bytes = size_t(1) << 30;
  void *a = nullptr, *b = nullptr;
  if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess)
  {
    m.summary = "could not allocate 2 GiB for the copy measurement";
    return m;
  }
  cudaMemset(a, 1, bytes);
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  std::vector<float> times;
  for (int k = 0; k < 11; ++k)
  {
    cudaEventRecord(start);
    cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    times.push_back(ms);
  }
  m.copyGigabytesPerSecond = 2.0 * bytes / (medianOf(times) * 1e-3) / 1e9;
  cudaFree(a);
  cudaFree(b);

  int device = 0, sms = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  const int blocks = sms * 16, threads = 256, iterations = 4096;
  float* out = nullptr;
  cudaMalloc(&out, sizeof(float) * blocks * threads);
  times.clear();
  for (int k = 0; k < 11; ++k)
  {
    cudaEventRecord(start);
    fmaChains<<<blocks, threads>>>(out, iterations, 0.999f, 0.001f);
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    times.push_back(ms);
  }
  const double flops = 2.0 * 8 * double(iterations) * blocks * threads;
  m.fp32Gigaflops = flops / (medianOf(times) * 1e-3) / 1e9;
  cudaFree(out);

  // Pinned host memory: what the engine's transfers could reach if the caller's arrays were
  // pinned (they are pageable; TransferRing.h stages them).
  const std::size_t up = std::size_t(48) << 20, down = std::size_t(16) << 20;
  void *pinned = nullptr, *onDevice = nullptr;
  if (cudaMallocHost(&pinned, up) == cudaSuccess && cudaMalloc(&onDevice, up) == cudaSuccess)
  {
    std::memset(pinned, 1, up);
    for (const bool toDevice : { true, false })
    {
      times.clear();
      for (int k = 0; k < 11; ++k)
      {
        cudaEventRecord(start);
        cudaMemcpyAsync(toDevice ? onDevice : pinned, toDevice ? pinned : onDevice, toDevice ? up : down,
          toDevice ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost);
        cudaEventRecord(stop);
        cudaEventSynchronize(stop);
        float ms = 0;
        cudaEventElapsedTime(&ms, start, stop);
        times.push_back(ms);
      }
      (toDevice ? m.pinnedUploadGigabytesPerSecond : m.pinnedDownloadGigabytesPerSecond) =
        double(toDevice ? up : down) / (medianOf(times) * 1e-3) / 1e9;
    }
  }
  cudaFreeHost(pinned);
  cudaFree(onDevice);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  char text[300];
  std::snprintf(text, sizeof text,
    "device-to-device copy %.0f GB/s (read + write), FP32 FMA %.1f TFLOP/s, pinned host to device %.1f GB/s "
    "(48 MiB), device to pinned host %.1f GB/s (16 MiB)",
    m.copyGigabytesPerSecond, m.fp32Gigaflops / 1000.0, m.pinnedUploadGigabytesPerSecond,
    m.pinnedDownloadGigabytesPerSecond);
  m.summary = text;
  return m;
}
