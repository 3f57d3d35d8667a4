// CUDA helpers: checked calls and RAII buffers. Included only by .cu files.
#pragma once

#include "NeighborGrid/NeighborGrid.h"

#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <utility>

namespace neighborgrid
{
namespace detail
{

[[noreturn]] inline void throwCudaError(cudaError_t code, const char* what, const char* file, int line)
{
  throw Error(std::string("NeighborGrid: CUDA failed in ") + what + " (" + file + ":" +
    std::to_string(line) + "): " + cudaGetErrorName(code) + ": " + cudaGetErrorString(code));
}

#define NG_CUDA_CHECK(call, what)                                                                  \
  do                                                                                               \
  {                                                                                                \
    const cudaError_t ngStatus = (call);                                                           \
    if (ngStatus != cudaSuccess)                                                                   \
    {                                                                                              \
      ::neighborgrid::detail::throwCudaError(ngStatus, what, __FILE__, __LINE__);                  \
    }                                                                                              \
  } while (0)

/// After a kernel launch: launch-configuration errors show up here.
#define NG_CUDA_CHECK_LAUNCH(what) NG_CUDA_CHECK(cudaGetLastError(), what)

/// Device memory that grows on demand and is kept across calls.
template <class T>
class DeviceBuffer
{
public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { release(); }

  T* ensure(std::size_t count, const char* what)
  {
    if (count > capacity_)
    {
      release();
      void* p = nullptr;
      const cudaError_t status = cudaMalloc(&p, std::max<std::size_t>(1, count) * sizeof(T));
      if (status != cudaSuccess)
      {
        (void)cudaGetLastError(); // clear the sticky-free allocation error
        throw Error(std::string("NeighborGrid: could not allocate ") +
          std::to_string(count * sizeof(T)) + " bytes of GPU memory for " + what + ": " +
          cudaGetErrorString(status));
      }
      data_ = static_cast<T*>(p);
      capacity_ = count;
    }
    return data_;
  }
  T* get() const { return data_; }
  std::size_t bytes() const { return capacity_ * sizeof(T); }
  void release()
  {
    if (data_)
    {
      cudaFree(data_);
      data_ = nullptr;
      capacity_ = 0;
    }
  }

private:
  T* data_ = nullptr;
  std::size_t capacity_ = 0;
};

/// Page-locked host memory: the only way transfers reach full PCIe bandwidth.
template <class T>
class PinnedBuffer
{
public:
  PinnedBuffer() = default;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer() { release(); }

  T* ensure(std::size_t count, const char* what)
  {
    if (count > capacity_)
    {
      release();
      void* p = nullptr;
      NG_CUDA_CHECK(cudaMallocHost(&p, std::max<std::size_t>(1, count) * sizeof(T)), what);
      data_ = static_cast<T*>(p);
      capacity_ = count;
    }
    return data_;
  }
  T* get() const { return data_; }
  void release()
  {
    if (data_)
    {
      cudaFreeHost(data_);
      data_ = nullptr;
      capacity_ = 0;
    }
  }

private:
  T* data_ = nullptr;
  std::size_t capacity_ = 0;
};

} // namespace detail
} // namespace neighborgrid
