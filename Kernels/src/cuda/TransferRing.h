// Host arrays to and from the device at the bus's speed. A caller's arrays are pageable (a VTK
// array, a std::vector): the copy engine reads them at a tenth of its speed, so they cross through
// a ring of small pinned slices. The host side of that is a memcpy per slice, and one thread
// copies far slower than PCIe moves, so worker threads, kept from transfer to transfer, each take
// whole slices in turn: their copies run side by side, and beside the DMA of the slices before
// them. The issuing thread only puts each slice on the stream once its copy is done (upload), or
// hands it to a worker once its DMA is done (download). Host memory: the ring only.
#pragma once

#include "CudaSupport.h"

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace neighborgrid
{
namespace detail
{

class TransferRing
{
public:
  // Small slices start the DMA early (the first waits for one slice's copy) and end it early (the
  // last copy out follows the last slice); 48 of them keep every worker busy.
  static constexpr std::size_t sliceBytes = std::size_t(1) << 20;
  static constexpr int slots = 48; // 48 MiB of pinned memory

  TransferRing() = default;
  TransferRing(const TransferRing&) = delete;
  TransferRing& operator=(const TransferRing&) = delete;
  ~TransferRing();

  /// Returns once `host` has been read: the DMA of the last slices may still run on `stream`.
  void upload(void* device, const void* host, std::size_t bytes, cudaStream_t stream, const char* what);
  /// Returns once `host` holds every byte.
  void download(void* host, const void* device, std::size_t bytes, cudaStream_t stream, const char* what);

private:
  struct Transfer
  {
    bool toDevice = true;
    char* device = nullptr;
    char* host = nullptr;
    std::size_t bytes = 0;
    std::int64_t chunks = 0;
    cudaStream_t stream = nullptr;
    const char* what = "";
  };

  void prepare();
  void run(const Transfer& t);
  void issue(const Transfer& t, std::int64_t chunk);
  void copySlices(const Transfer& t);
  /// Spins (yielding) until ready() or an abort; false on abort.
  bool waitFor(const std::function<bool()>& ready) const;
  std::size_t lengthOf(const Transfer& t, std::int64_t chunk) const
  {
    return std::min(sliceBytes, t.bytes - std::size_t(chunk) * sliceBytes);
  }
  char* slot(std::int64_t chunk) const { return ring_.get() + std::size_t(chunk % slots) * sliceBytes; }

  // The pool: workers sleep between transfers and run copySlices on the current one.
  void startWorkers();
  void workerLoop();
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_, finished_;
  std::uint64_t generation_ = 0;
  int busy_ = 0;
  bool quit_ = false;
  const Transfer* current_ = nullptr;

  // Per transfer: the next chunk a worker takes; per slot, the last chunk put on the stream and
  // the last chunk whose host side (copy in or out) is done; the first failure.
  std::atomic<std::int64_t> nextChunk_{ 0 };
  std::atomic<std::int64_t> issued_[slots];
  std::atomic<std::int64_t> copied_[slots];
  std::atomic<bool> abort_{ false };
  std::mutex failureMutex_;
  std::exception_ptr failure_;

  int device_ = -1;
  PinnedBuffer<char> ring_;
  cudaEvent_t events_[slots] = {};
};

} // namespace detail
} // namespace neighborgrid
