// TransferRing (TransferRing.h): pinned slices, worker threads, and the order of a transfer.
//
// Upload of chunk k (slot k % slots): a worker taking one of its pieces waits until the copy on
// the stream of the slot's previous chunk (k - slots) is done, copies the piece into the slot and
// counts it; the issuing thread, in chunk order, waits until all pieces of a group of chunks are
// counted and puts the group's copy on the stream. Download mirrors it: the issuing thread puts a
// group's copy on the stream once every piece of its slots' previous chunks has been copied out;
// a worker waits for chunk k's copy and copies its piece out. ("DMA" below: that copy, by the copy
// engine or by slotCopyKernel.) One wait on the driver a chunk (waitForDmas): a driver call per
// piece from every worker serialized on the driver and halved the rate of 768 MB uploads. A
// slot's event is recorded again only once every piece of its chunk is done, so the event a
// worker waits on is the one of the chunk it needs. Workers take pieces in increasing order, so
// every wait is on an earlier chunk: no deadlock.
#include "TransferRing.h"

#include "TransferMemory.h"

#include <algorithm>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace neighborgrid
{
namespace detail
{

namespace
{

/// Copies `bytes` from `from` to `to`, one of them a pinned slot (mapped: the SMs read or write
/// host memory across the bus). Both 16-byte aligned; the tail below 16 bytes by bytes.
__global__ void slotCopyKernel(char* __restrict__ to, const char* __restrict__ from, std::size_t bytes)
{
  const std::size_t vectors = bytes / sizeof(int4);
  const std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
  const std::size_t first = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  int4* toVectors = reinterpret_cast<int4*>(to);
  const int4* fromVectors = reinterpret_cast<const int4*>(from);
  for (std::size_t i = first; i < vectors; i += stride)
  {
    toVectors[i] = fromVectors[i];
  }
  const std::size_t tail = vectors * sizeof(int4) + first;
  if (tail < bytes)
  {
    to[tail] = from[tail];
  }
}

/// Two blocks of 512 threads an SM (132 SMs on the H100 and H200): as fast as four.
constexpr int slotCopyBlocks = 264;
constexpr int slotCopyThreads = 512;

bool aligned16(const void* p)
{
  return (reinterpret_cast<std::uintptr_t>(p) & 15) == 0;
}

} // namespace

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

void TransferRing::uploadCoordinates(void* device, const void* host, std::int64_t count, bool isDouble,
  cudaStream_t stream, const char* what, CoordinateBounds& bounds)
{
  bounds.reset();
  Transfer t;
  t.toDevice = true;
  t.device = static_cast<char*>(device);
  t.host = const_cast<char*>(static_cast<const char*>(host)); // only read for an upload
  t.bytes = 3 * std::size_t(count) * (isDouble ? sizeof(double) : sizeof(float));
  t.stream = stream;
  t.what = what;
  t.bounds = &bounds;
  t.boundsOfDoubles = isDouble;
  run(t);
}

void TransferRing::download(void* host, const void* device, std::size_t bytes, cudaStream_t stream, const char* what)
{
  if (isTransferMemory(host, bytes))
  {
    // Pinned already (Engine::allocateTransferMemory): one DMA, no ring.
    NG_CUDA_CHECK(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream), what);
    NG_CUDA_CHECK(cudaStreamSynchronize(stream), what);
    return;
  }
  Transfer t;
  t.toDevice = false;
  t.device = const_cast<char*>(static_cast<const char*>(device));
  t.host = static_cast<char*>(host);
  t.bytes = bytes;
  t.stream = stream;
  t.what = what;
  run(t);
}

/// Makes [host, host + length) resident and writable without changing a byte. Linux 5.14 and
/// later do it in one call (MADV_POPULATE_WRITE), in the kernel: on the H100 machine the first
/// download into 16 MB of never-touched memory took 40-90 ms when 15 threads faulted its pages
/// by touching them (a read fault maps the zero page, the write a second fault), about 5 ms
/// after that. Elsewhere, or where the call fails, a write of the byte read does it.
void TransferRing::makeResident(char* host, std::size_t length)
{
#if defined(__linux__) && defined(MADV_POPULATE_WRITE)
  const std::uintptr_t page = 4096;
  const std::uintptr_t begin = reinterpret_cast<std::uintptr_t>(host) & ~(page - 1);
  const std::uintptr_t end = reinterpret_cast<std::uintptr_t>(host) + length;
  if (madvise(reinterpret_cast<void*>(begin), end - begin, MADV_POPULATE_WRITE) == 0)
  {
    return;
  }
#endif
  for (std::size_t b = 0; b < length; b += 4096)
  {
    volatile char* c = host + b;
    *c = *c;
  }
}

void TransferRing::faultIn(void* host, std::size_t bytes)
{
  if (isTransferMemory(host, bytes))
  {
    return; // pinned pages are resident
  }
  Transfer t;
  t.toDevice = false;
  t.faultInOnly = true;
  t.host = static_cast<char*>(host);
  t.bytes = bytes;
  t.what = "faulting in result pages";
  run(t);
}

/// On first use, not at construction: events belong to the device current then, which is the
/// backend's only once its constructor has selected it (an engine on device 1 of a node).
void TransferRing::prepare()
{
  if (!events_[0])
  {
    NG_CUDA_CHECK(cudaGetDevice(&device_), "cudaGetDevice");
    int unified = 0;
    NG_CUDA_CHECK(cudaDeviceGetAttribute(&unified, cudaDevAttrUnifiedAddressing, device_), "cudaDeviceGetAttribute");
    kernelsReachSlots_ = unified != 0; // cudaMallocHost's memory is mapped at its own address
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
      if (!t->faultInOnly)
      {
        NG_CUDA_CHECK(cudaSetDevice(device_), "cudaSetDevice");
      }
      copyShare(*t);
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
    busy_.fetch_sub(1, std::memory_order_release); // after the failure, if any, is recorded
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

bool TransferRing::waitForDmas(const Transfer& t, std::int64_t count, bool firstPiece)
{
  if (!firstPiece)
  {
    return waitFor([&] { return dmaDone_.load(std::memory_order_acquire) >= count; });
  }
  if (!waitFor([&] { return issued_.load(std::memory_order_acquire) >= count; }))
  {
    return false;
  }
  NG_CUDA_CHECK(cudaEventSynchronize(events_[(count - 1) % slots]), t.what);
  // The stream runs its copies in order: chunks 0..count-1 are done, whatever was published.
  std::int64_t known = dmaDone_.load(std::memory_order_relaxed);
  while (known < count && !dmaDone_.compare_exchange_weak(known, count, std::memory_order_release))
  {
  }
  return true;
}

void TransferRing::copyShare(const Transfer& t)
{
  CoordinateBounds mine;
  copySlices(t, mine);
  if (t.bounds)
  {
    std::lock_guard<std::mutex> lock(failureMutex_);
    t.bounds->merge(mine);
  }
}

void TransferRing::copySlices(const Transfer& t, CoordinateBounds& bounds)
{
  for (;;)
  {
    const std::int64_t piece = nextPiece_.fetch_add(1);
    if (piece >= t.pieces || abort_.load(std::memory_order_relaxed))
    {
      return;
    }
    const std::int64_t k = piece / t.piecesPerSlice;
    const std::size_t within = std::size_t(piece % t.piecesPerSlice) * t.pieceBytes;
    const std::size_t length = std::min(t.pieceBytes, lengthOf(t, k) - within);
    char* host = t.host + std::size_t(k) * sliceBytes + within;
    if (t.faultInOnly)
    {
      makeResident(host, length);
      continue;
    }
    char* pinned = slot(k) + within;
    // Upload: the slot is free once its previous chunk's DMA is done. Download: chunk k's DMA.
    const std::int64_t dmasNeeded = t.toDevice ? k - slots + 1 : k + 1;
    if (dmasNeeded > 0 && !waitForDmas(t, dmasNeeded, within == 0))
    {
      return;
    }
    if (t.toDevice)
    {
      std::memcpy(pinned, host, length);
    }
    else
    {
      std::memcpy(host, pinned, length);
    }
    copiedPieces_[k % slots].fetch_add(1, std::memory_order_acq_rel);
    if (t.bounds)
    {
      // After the piece is counted (its DMA need not wait), from this core's cache, where the
      // copy has just brought the piece. Pieces start at whole values (their sizes are
      // multiples of 8 bytes).
      const std::size_t value = t.boundsOfDoubles ? sizeof(double) : sizeof(float);
      const std::size_t first = (std::size_t(k) * sliceBytes + within) / value;
      widenBounds(host, length / value, static_cast<int>(first % 3), t.boundsOfDoubles, bounds);
    }
  }
}

std::int64_t TransferRing::groupEnd(const Transfer& t, std::int64_t first, int group) const
{
  std::int64_t size = 1; // a download within the ring: its first slice reaches the workers early
  if (!t.fitsRing)
  {
    size = t.toDevice ? 8 : 4;
  }
  else if (t.toDevice)
  {
    size = std::int64_t(1) << std::min(group, 3); // 1, 2, 4, then 8: the first starts early
  }
  const std::int64_t ringEnd = (first / slots + 1) * slots;
  return std::min({ t.chunks, first + size, ringEnd });
}

bool TransferRing::slotReady(const Transfer& t, std::int64_t k) const
{
  const std::int64_t needed = t.toDevice ? k : k - slots;
  return needed < 0 || copiedPieces_[k % slots].load(std::memory_order_acquire) >= piecesThrough(t, needed);
}

void TransferRing::issue(const Transfer& t, std::int64_t first, std::int64_t end)
{
  const std::size_t offset = std::size_t(first) * sliceBytes;
  const std::size_t bytes = std::min(t.bytes, std::size_t(end) * sliceBytes) - offset;
  char* pinned = slot(first);
  char* device = t.device + offset;
  if (t.fitsRing && kernelsReachSlots_ && aligned16(device))
  {
    char* to = t.toDevice ? device : pinned;
    const char* from = t.toDevice ? pinned : device;
    slotCopyKernel<<<slotCopyBlocks, slotCopyThreads, 0, t.stream>>>(to, from, bytes);
    NG_CUDA_CHECK(cudaGetLastError(), t.what);
  }
  else if (t.toDevice)
  {
    NG_CUDA_CHECK(cudaMemcpyAsync(device, pinned, bytes, cudaMemcpyHostToDevice, t.stream), t.what);
  }
  else
  {
    NG_CUDA_CHECK(cudaMemcpyAsync(pinned, device, bytes, cudaMemcpyDeviceToHost, t.stream), t.what);
  }
  for (std::int64_t k = first; k < end; ++k)
  {
    NG_CUDA_CHECK(cudaEventRecord(events_[k % slots], t.stream), t.what);
  }
  issued_.store(end, std::memory_order_release);
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
  // Faulting in: whole slices, so that a worker's pages are contiguous (interleaved pieces of
  // 64 KiB had the workers' faults wait on each other's page-table locks).
  t.fitsRing = t.chunks <= slots;
  if (t.fitsRing && !t.faultInOnly)
  {
    t.pieceBytes = smallPieceBytes;
    t.piecesPerSlice = std::int64_t(sliceBytes / smallPieceBytes);
  }
  t.pieces = static_cast<std::int64_t>((t.bytes + t.pieceBytes - 1) / t.pieceBytes);
  nextPiece_ = 0;
  issued_ = 0;
  dmaDone_ = 0;
  abort_ = false;
  failure_ = nullptr;
  for (auto& copied : copiedPieces_)
  {
    copied = 0;
  }
  // Wait for the ring's last use (an upload returns before its last DMA is done). Faulting in
  // pages touches no slot and calls no CUDA function, so a fault of the kernels it overlaps is
  // reported by the wait that follows them, under their name, not under this one's.
  if (!t.faultInOnly)
  {
    for (cudaEvent_t e : events_)
    {
      NG_CUDA_CHECK(cudaEventSynchronize(e), t.what);
    }
  }
  if (t.faultInOnly)
  {
    t.chunks = 0; // nothing to issue: the workers touch the pages and the loop below is empty
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    current_ = &t;
    busy_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
    ++generation_;
  }
  wake_.notify_all();

  std::exception_ptr issuing;
  try
  {
    int group = 0;
    for (std::int64_t first = 0; first < t.chunks && !abort_.load(std::memory_order_relaxed); ++group)
    {
      const std::int64_t end = groupEnd(t, first, group);
      for (std::int64_t k = first; k < end; ++k)
      {
        if (!waitFor([&] { return slotReady(t, k); }))
        {
          break;
        }
      }
      if (abort_.load(std::memory_order_relaxed))
      {
        break;
      }
      issue(t, first, end);
      first = end;
    }
    if (!t.toDevice)
    {
      // Every chunk copied out: the last `slots` chunks' marks.
      for (std::int64_t k = std::max<std::int64_t>(0, t.chunks - slots); k < t.chunks; ++k)
      {
        const int s = static_cast<int>(k % slots);
        if (!waitFor([&] { return copiedPieces_[s].load(std::memory_order_acquire) >= piecesThrough(t, k); }))
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
  // Spun, not slept on a condition variable: a download ends when the last worker does (H200,
  // four rounds taking turns: the 4M row's end to end 0.04-0.14 ms shorter in three, 0.9 in one
  // where the sleeping version ran slow; periodic 0.05-0.30 ms shorter in all four).
  while (busy_.load(std::memory_order_acquire) != 0)
  {
    std::this_thread::yield();
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
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
