// CUB's device-wide exclusive sum with its two calls (size the temporary storage, then scan) and
// the storage taken from a buffer that is kept across runs. Included only by .cu files.
#pragma once

#include "CudaSupport.h"

#include <cub/device/device_scan.cuh>

#include <cstddef>

namespace neighborgrid
{
namespace detail
{

/// out[i] = in[0] + ... + in[i - 1] for i < count, queued on `stream`; scratch grows to CUB's
/// temporary storage if it is smaller (a buffer that only grows: the second of two scans of the
/// same size queues no allocation).
template <class In, class Out, class Count>
void exclusiveSum(In in, Out out, Count count, DeviceBufferBase& scratch, cudaStream_t stream, const char* what)
{
  std::size_t bytes = 0;
  NG_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, bytes, in, out, count, stream), what);
  void* temp = scratch.ensureBytes(bytes, what);
  NG_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(temp, bytes, in, out, count, stream), what);
}

} // namespace detail
} // namespace neighborgrid
