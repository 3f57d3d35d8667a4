// CUDA helpers: checked calls, device buffers that a pool can account for and release, pinned
// host buffers. Included only by .cu files.
#pragma once

#include "NeighborGrid/NeighborGrid.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

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

/// "12.3 GB" for messages.
inline std::string formatBytes(double bytes)
{
  std::ostringstream s;
  s.precision(3);
  if (bytes >= 1e9)
  {
    s << bytes / 1e9 << " GB";
  }
  else if (bytes >= 1e6)
  {
    s << bytes / 1e6 << " MB";
  }
  else
  {
    s << bytes / 1e3 << " kB";
  }
  return s.str();
}

class DevicePool;

/// Untyped device memory that grows on demand, is kept across calls, and belongs to a pool.
class DeviceBufferBase
{
public:
  explicit DeviceBufferBase(DevicePool& pool);
  DeviceBufferBase(const DeviceBufferBase&) = delete;
  DeviceBufferBase& operator=(const DeviceBufferBase&) = delete;
  virtual ~DeviceBufferBase();

  void* ensureBytes(std::size_t bytes, const char* what)
  {
    if (bytes > capacity_)
    {
      release();
      void* p = nullptr;
      const cudaError_t status = cudaMalloc(&p, std::max<std::size_t>(1, bytes));
      if (status != cudaSuccess)
      {
        (void)cudaGetLastError(); // an allocation failure is not sticky: clear it
        std::size_t freeBytes = 0, totalBytes = 0;
        cudaMemGetInfo(&freeBytes, &totalBytes);
        throw Error(std::string("NeighborGrid: could not allocate ") + formatBytes(double(bytes)) +
          " of GPU memory for " + what + " (" + cudaGetErrorString(status) + "; " + formatBytes(double(freeBytes)) +
          " of " + formatBytes(double(totalBytes)) + " free)");
      }
      data_ = p;
      capacity_ = bytes;
    }
    return data_;
  }
  void* raw() const { return data_; }
  std::size_t bytes() const { return capacity_; }
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
  DevicePool& pool_;
  void* data_ = nullptr;
  std::size_t capacity_ = 0;
};

/// Every device buffer of a backend: how much they hold, and a way to give it all back (before a
/// run that needs more than is free, so that no cached buffer stands in its way).
class DevicePool
{
public:
  void add(DeviceBufferBase* b) { buffers_.push_back(b); }
  void remove(DeviceBufferBase* b) { buffers_.erase(std::remove(buffers_.begin(), buffers_.end(), b), buffers_.end()); }
  std::size_t heldBytes() const
  {
    std::size_t total = 0;
    for (auto* b : buffers_)
    {
      total += b->bytes();
    }
    return total;
  }
  void releaseAll()
  {
    for (auto* b : buffers_)
    {
      b->release();
    }
  }

private:
  std::vector<DeviceBufferBase*> buffers_;
};

inline DeviceBufferBase::DeviceBufferBase(DevicePool& pool) : pool_(pool)
{
  pool_.add(this);
}
inline DeviceBufferBase::~DeviceBufferBase()
{
  release();
  pool_.remove(this);
}

template <class T>
class DeviceBuffer : public DeviceBufferBase
{
public:
  explicit DeviceBuffer(DevicePool& pool) : DeviceBufferBase(pool) {}
  T* ensure(std::size_t count, const char* what) { return static_cast<T*>(ensureBytes(count * sizeof(T), what)); }
  T* get() const { return static_cast<T*>(raw()); }
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

/// A point in a stream the host, or another stream, can wait for without waiting for the work
/// queued after it (an event without timing, created on first use).
class StreamMark
{
public:
  StreamMark() = default;
  StreamMark(const StreamMark&) = delete;
  StreamMark& operator=(const StreamMark&) = delete;
  ~StreamMark()
  {
    if (event_)
    {
      cudaEventDestroy(event_);
    }
  }
  void record(cudaStream_t stream)
  {
    if (!event_)
    {
      NG_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "creating an event");
    }
    NG_CUDA_CHECK(cudaEventRecord(event_, stream), "marking a stream");
  }
  void wait(const char* what) const { NG_CUDA_CHECK(cudaEventSynchronize(event_), what); }
  /// Work queued on `stream` from now on waits for the marked point (not for what followed it).
  void holdBack(cudaStream_t stream, const char* what) const { NG_CUDA_CHECK(cudaStreamWaitEvent(stream, event_, 0), what); }

private:
  cudaEvent_t event_ = nullptr;
};

/// Work that a function queues on a stream, captured into a CUDA graph the first time and
/// launched as that graph while the caller's key (everything the queued work's arguments depend
/// on: buffers, sizes, the stream) stays the same. A graph's kernels and memsets start closer
/// together than the same ones queued one by one: CUB's radix sort of 4M pairs of 23-bit keys
/// took 0.156 ms queued and 0.147 as a graph (H200, a probe), and with it Staged Tiles' sort
/// stage took 0.323-0.326 -> 0.313-0.316 ms on the 4M rows, 0.169-0.177 -> 0.161-0.165 at 2M
/// and 0.573-0.575 -> 0.565-0.568 at 8M (RESULTS.md, issue 22). Capturing and instantiating
/// took 33 us of the host's time (the probe), once for each set of buffers and sizes.
template <class Key>
class CapturedWork
{
public:
  CapturedWork() = default;
  CapturedWork(const CapturedWork&) = delete;
  CapturedWork& operator=(const CapturedWork&) = delete;
  ~CapturedWork() { forget(); }
  /// Queues queue(stream)'s work on `stream`. Returns true where queue ran (captured now for
  /// `key`), so that the caller can keep what it changed on the host; false where the graph
  /// captured before for the same key was launched instead.
  template <class Queue>
  bool launch(const Key& key, cudaStream_t stream, Queue&& queue, const char* what)
  {
    if (exec_ && key == key_)
    {
      NG_CUDA_CHECK(cudaGraphLaunch(exec_, stream), what);
      return false;
    }
    forget();
    NG_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), what);
    cudaGraph_t graph = nullptr;
    try
    {
      queue(stream);
    }
    catch (...)
    {
      cudaStreamEndCapture(stream, &graph);
      if (graph)
      {
        cudaGraphDestroy(graph);
      }
      throw;
    }
    NG_CUDA_CHECK(cudaStreamEndCapture(stream, &graph), what);
    const cudaError_t made = cudaGraphInstantiate(&exec_, graph, 0);
    cudaGraphDestroy(graph);
    if (made != cudaSuccess)
    {
      exec_ = nullptr;
    }
    NG_CUDA_CHECK(made, what);
    key_ = key;
    NG_CUDA_CHECK(cudaGraphLaunch(exec_, stream), what);
    return true;
  }

private:
  void forget()
  {
    if (exec_)
    {
      cudaGraphExecDestroy(exec_);
      exec_ = nullptr;
    }
  }
  Key key_{};
  cudaGraphExec_t exec_ = nullptr;
};

/// Lets `kernel` launch with `bytes` of dynamic shared memory on `device`: raises its limit where
/// it is lower, and only then calls the driver (runs of a few thousand points are mostly such host
/// calls). Limits only grow, so a limit another engine raised on the same device stays valid.
template <class Kernel>
void allowDynamicSharedMemory(Kernel* kernel, int device, std::size_t bytes, const char* what)
{
  static std::mutex guard;
  static std::map<std::pair<int, const void*>, std::size_t> raised;
  const std::lock_guard<std::mutex> lock(guard);
  std::size_t& limit = raised[{ device, reinterpret_cast<const void*>(kernel) }];
  if (bytes > limit)
  {
    NG_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)), what);
    limit = bytes;
  }
}

/// Blocks for a grid-stride or one-item-per-thread launch of `count` items.
inline int blocksFor(std::int64_t count, int threads = 256)
{
  return static_cast<int>(std::max<std::int64_t>(1, (count + threads - 1) / threads));
}

} // namespace detail
} // namespace neighborgrid
