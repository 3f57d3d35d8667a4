// TransferRing (TransferRing.h): pinned slices, worker threads, and the order of a transfer.
//
// Upload of chunk k (slot k % slots): a worker waits until the slot's previous chunk (k - slots)
// has been put on the stream and its DMA is done, copies chunk k into the slot, and marks it
// copied; the issuing thread, in chunk order, waits for that mark and puts the slot's DMA on the
// stream. Download mirrors it: the issuing thread puts chunk k's DMA on the stream once the slot's
// previous chunk has been copied out; a worker waits for that DMA and copies the slot out.
// Workers take chunks in increasing order, so every wait is on an earlier chunk: no deadlock.
#include "TransferRing.h"

#include <algorithm>

namespace neighborgrid
{
namespace detail
{

TransferRing::~TransferRing()
{
  {
    std::lock_guard<std::mutex> lock(mutex_);
    quit_ = true;
  }
  wake_.notify_all();
  for (std::thread& w : workers_)
  {
    w.join();
  }
  for (cudaEvent_t e : events_)
  {
    if (e)
    {
      cudaEventDestroy(e);
    }
  }
}

void TransferRing::upload(void* device, const void* host, std::size_t bytes, cudaStream_t stream, const char* what)
{
  Transfer t;
  t.toDevice = true;
  t.device = static_cast<char*>(device);
  t.host = const_cast<char*>(static_cast<const char*>(host)); // only read for an upload
  t.bytes = bytes;
  t.stream = stream;
  t.what = what;
  run(t);
}

void TransferRing::download(void* host, const void* device, std::size_t bytes, cudaStream_t stream, const char* what)
{
  Transfer t;
  t.toDevice = false;
  t.device = const_cast<char*>(static_cast<const char*>(device));
  t.host = static_cast<char*>(host);
  t.bytes = bytes;
  t.stream = stream;
  t.what = what;
  run(t);
}

/// On first use, not at construction: events belong to the device current then, which is the
/// backend's only once its constructor has selected it (an engine on device 1 of a node).
void TransferRing::prepare()
{
  if (!events_[0])
  {
    NG_CUDA_CHECK(cudaGetDevice(&device_), "cudaGetDevice");
    for (cudaEvent_t& e : events_)
    {
      NG_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    }
  }
  ring_.ensure(sliceBytes * slots, "transfer ring (pinned host memory)");
  if (workers_.empty())
  {
    startWorkers();
  }
}

void TransferRing::startWorkers()
{
  // Every core but the issuing thread's, up to 16: host memory bandwidth, not core count, is the
  // limit beyond that.
  const unsigned cores = std::max(2u, std::thread::hardware_concurrency());
  const unsigned count = std::min(16u, cores - 1);
  for (unsigned w = 0; w < count; ++w)
  {
    workers_.emplace_back([this] { workerLoop(); });
  }
}

void TransferRing::workerLoop()
{
  std::uint64_t seen = 0;
  for (;;)
  {
    const Transfer* t = nullptr;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return quit_ || generation_ != seen; });
      if (quit_)
      {
        return;
      }
      seen = generation_;
      t = current_;
    }
    try
    {
      NG_CUDA_CHECK(cudaSetDevice(device_), "cudaSetDevice");
      copySlices(*t);
    }
    catch (...)
    {
      std::lock_guard<std::mutex> lock(failureMutex_);
      if (!failure_)
      {
        failure_ = std::current_exception();
      }
      abort_ = true;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    if (--busy_ == 0)
    {
      finished_.notify_one();
    }
  }
}

bool TransferRing::waitFor(const std::function<bool()>& ready) const
{
  while (!ready())
  {
    if (abort_.load(std::memory_order_relaxed))
    {
      return false;
    }
    std::this_thread::yield();
  }
  return true;
}

void TransferRing::copySlices(const Transfer& t)
{
  for (;;)
  {
    const std::int64_t k = nextChunk_.fetch_add(1);
    if (k >= t.chunks || abort_.load(std::memory_order_relaxed))
    {
      return;
    }
    const int s = static_cast<int>(k % slots);
    char* pinned = slot(k);
    char* host = t.host + std::size_t(k) * sliceBytes;
    if (t.toDevice)
    {
      // The slot is free once the DMA of its previous chunk is done.
      if (k >= slots)
      {
        if (!waitFor([&] { return issued_[s].load(std::memory_order_acquire) >= k - slots; }))
        {
          return;
        }
        NG_CUDA_CHECK(cudaEventSynchronize(events_[s]), t.what);
      }
      std::memcpy(pinned, host, lengthOf(t, k));
    }
    else
    {
      if (!waitFor([&] { return issued_[s].load(std::memory_order_acquire) >= k; }))
      {
        return;
      }
      NG_CUDA_CHECK(cudaEventSynchronize(events_[s]), t.what);
      std::memcpy(host, pinned, lengthOf(t, k));
    }
    copied_[s].store(k, std::memory_order_release);
  }
}

void TransferRing::issue(const Transfer& t, std::int64_t k)
{
  const int s = static_cast<int>(k % slots);
  const std::size_t offset = std::size_t(k) * sliceBytes;
  if (t.toDevice)
  {
    NG_CUDA_CHECK(cudaMemcpyAsync(t.device + offset, slot(k), lengthOf(t, k), cudaMemcpyHostToDevice, t.stream), t.what);
  }
  else
  {
    NG_CUDA_CHECK(cudaMemcpyAsync(slot(k), t.device + offset, lengthOf(t, k), cudaMemcpyDeviceToHost, t.stream), t.what);
  }
  NG_CUDA_CHECK(cudaEventRecord(events_[s], t.stream), t.what);
  issued_[s].store(k, std::memory_order_release);
}

void TransferRing::run(const Transfer& given)
{
  if (given.bytes == 0)
  {
    return;
  }
  prepare();
  Transfer t = given;
  t.chunks = static_cast<std::int64_t>((t.bytes + sliceBytes - 1) / sliceBytes);
  nextChunk_ = 0;
  abort_ = false;
  failure_ = nullptr;
  for (int s = 0; s < slots; ++s)
  {
    issued_[s] = -1;
    copied_[s] = -1;
  }
  // Wait for the ring's last use (an upload returns before its last DMA is done).
  for (cudaEvent_t e : events_)
  {
    NG_CUDA_CHECK(cudaEventSynchronize(e), t.what);
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    current_ = &t;
    busy_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  wake_.notify_all();

  std::exception_ptr issuing;
  try
  {
    for (std::int64_t k = 0; k < t.chunks; ++k)
    {
      const int s = static_cast<int>(k % slots);
      // Upload: chunk k is in its slot. Download: the slot's previous chunk has been copied out.
      const std::int64_t needed = t.toDevice ? k : k - slots;
      if (needed >= 0 && !waitFor([&] { return copied_[s].load(std::memory_order_acquire) >= needed; }))
      {
        break;
      }
      issue(t, k);
    }
    if (!t.toDevice)
    {
      // Every chunk copied out: the last `slots` chunks' marks.
      for (std::int64_t k = std::max<std::int64_t>(0, t.chunks - slots); k < t.chunks; ++k)
      {
        const int s = static_cast<int>(k % slots);
        if (!waitFor([&] { return copied_[s].load(std::memory_order_acquire) >= k; }))
        {
          break;
        }
      }
    }
  }
  catch (...)
  {
    issuing = std::current_exception();
    abort_ = true;
  }
  {
    std::unique_lock<std::mutex> lock(mutex_);
    finished_.wait(lock, [&] { return busy_ == 0; });
    current_ = nullptr;
  }
  if (issuing)
  {
    std::rethrow_exception(issuing);
  }
  if (failure_)
  {
    std::rethrow_exception(failure_);
  }
}

} // namespace detail
} // namespace neighborgrid
