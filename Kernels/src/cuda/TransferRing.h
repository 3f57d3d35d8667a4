// Host arrays to and from the device at the bus's speed. A caller's arrays are pageable (a VTK
// array, a std::vector): the copy engine reads them at a tenth of its speed, so they cross through
// a ring of small pinned slices. The host side of that is a memcpy per slice, and one thread
// copies far slower than PCIe moves, so worker threads, kept from transfer to transfer, share the
// copies, beside the DMA of the slices before them. A transfer that fits the ring is cut into
// pieces of a sixteenth of a slice, so that all workers share each slice: the slices are ready in
// order at the workers' combined speed (the DMA starts after one slice's pieces, not after one
// thread's copy of a whole slice: 0.37 ms with 15 copying on the H100 machine), and a download's
// last slice is copied out by all of them. A larger transfer keeps whole slices, one a worker:
// there many slices are in flight, and a pipeline of shared slices waits on each one's DMA in
// turn (4 GB of results downloaded at 34 GB/s instead of 48). The issuing thread puts each
// group of slices on the stream once their pieces are copied (upload), or hands them to the
// workers once their copy is done (download). Host memory: the ring only.
//
// How a group crosses the bus (groupEnd; H200 machine, 15 workers copying beside it): in a
// transfer that fits the ring, a kernel reads the pinned slices (or writes them), where the copy
// engine lost most to the workers' use of host memory. 48 MiB up: 1.04 ms with kernels over
// groups of 1, 2, 4, then 8 slices, against 1.30-1.36 ms with a DMA a slice (probe); the engine's
// coordinates stage at 4M points 1.47-1.49 ms against 1.83-1.85. Downloads within the ring keep
// one slice a group (16 MiB: groups of halving size were no faster in the engine). Larger
// transfers keep the DMA, in groups of 8 slices up and 4 down: 768 MiB up in 15.5 ms with groups
// of 4 (probe; a DMA a slice 17.2, kernels of 4 slices 16.7); in the engine's 64M run (the last
// run's stages, three rounds) 768 MiB up in 15.47-15.60 ms with groups of 8 (15.56-15.67 with 4),
// 256 MiB down in 5.24-5.27 ms with groups of 4 (5.53-5.55 with one slice).
#pragma once

#include "../CoordinateBounds.h"
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
  // A worker's unit in a transfer that fits the ring: a sixteenth of a slice.
  static constexpr std::size_t smallPieceBytes = sliceBytes / 16;

  TransferRing() = default;
  TransferRing(const TransferRing&) = delete;
  TransferRing& operator=(const TransferRing&) = delete;
  ~TransferRing();

  /// Returns once `host` has been read: the DMA of the last slices may still run on `stream`.
  void upload(void* device, const void* host, std::size_t bytes, cudaStream_t stream, const char* what);
  /// upload() of `count` points' interleaved coordinates (float or double) that also finds their
  /// bounds: the workers widen them while they copy the slices (CoordinateBounds.h).
  void uploadCoordinates(void* device, const void* host, std::int64_t count, bool isDouble, cudaStream_t stream,
    const char* what, CoordinateBounds& bounds);
  /// Returns once `host` holds every byte.
  void download(void* host, const void* device, std::size_t bytes, cudaStream_t stream, const char* what);
  /// Makes every page of `host` resident and writable, on the workers, without changing a byte:
  /// a download into fresh pages (a new VTK array) otherwise takes a page fault per 4 KiB in the
  /// copy out, after the GPU is done. Called while the GPU searches.
  void faultIn(void* host, std::size_t bytes);

private:
  struct Transfer
  {
    bool toDevice = true;
    bool faultInOnly = false; // faultIn(): no DMA, the workers touch the host pages
    char* device = nullptr;
    char* host = nullptr;
    std::size_t bytes = 0;
    std::int64_t chunks = 0;
    std::size_t pieceBytes = sliceBytes; // smallPieceBytes where the transfer fits the ring
    std::int64_t piecesPerSlice = 1;
    std::int64_t pieces = 0;
    cudaStream_t stream = nullptr;
    const char* what = "";
    CoordinateBounds* bounds = nullptr; // uploadCoordinates(): the bounds of what is copied
    bool boundsOfDoubles = false;
    bool fitsRing = false; // every chunk has a slot of its own
  };

  void prepare();
  void run(const Transfer& t);
  /// Puts chunks [first, end) on the stream as one copy, and an event for each of their slots.
  void issue(const Transfer& t, std::int64_t first, std::int64_t end);
  /// The end of the group that starts at chunk `first`, the transfer's `group`-th (see above);
  /// a group never wraps around the ring.
  std::int64_t groupEnd(const Transfer& t, std::int64_t first, int group) const;
  /// Whether chunk k's slot is ready for its copy on the stream: an upload's chunk k is in it, a
  /// download's previous chunk in that slot has been copied out.
  bool slotReady(const Transfer& t, std::int64_t k) const;
  /// A worker's share of a transfer: copySlices, then its bounds into the transfer's.
  void copyShare(const Transfer& t);
  void copySlices(const Transfer& t, CoordinateBounds& bounds);
  /// A faultIn() piece: its pages resident and writable, its bytes unchanged.
  static void makeResident(char* host, std::size_t length);
  /// Spins (yielding) until ready() or an abort; false on abort.
  bool waitFor(const std::function<bool()>& ready) const;
  /// Returns once the DMAs of chunks 0..count-1 are done (false on abort). The worker holding a
  /// chunk's first piece waits on the driver and publishes; the chunk's other pieces wait for
  /// that, so the driver sees one wait a chunk however many pieces it has.
  bool waitForDmas(const Transfer& t, std::int64_t count, bool firstPiece);
  std::size_t lengthOf(const Transfer& t, std::int64_t chunk) const
  {
    return std::min(sliceBytes, t.bytes - std::size_t(chunk) * sliceBytes);
  }
  char* slot(std::int64_t chunk) const { return ring_.get() + std::size_t(chunk % slots) * sliceBytes; }
  /// Pieces done in chunk k's slot once chunk k's host side is done: the slot's earlier chunks
  /// are whole slices (only a transfer's last chunk is shorter).
  std::int64_t piecesThrough(const Transfer& t, std::int64_t chunk) const
  {
    const std::int64_t own = std::int64_t((lengthOf(t, chunk) + t.pieceBytes - 1) / t.pieceBytes);
    return (chunk / slots) * t.piecesPerSlice + own;
  }

  // The pool: workers sleep between transfers and run copySlices on the current one.
  void startWorkers();
  void workerLoop();
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::uint64_t generation_ = 0;
  std::atomic<int> busy_{ 0 }; // workers still on the current transfer
  bool quit_ = false;
  const Transfer* current_ = nullptr;

  // Per transfer: the next piece a worker takes; the chunks put on the stream, and those whose
  // DMA is known to be done (a prefix: the stream runs them in order); per slot, the pieces whose
  // host side (copy in or out) is done, over the transfer's chunks in that slot; the first failure.
  std::atomic<std::int64_t> nextPiece_{ 0 };
  std::atomic<std::int64_t> issued_{ 0 };
  std::atomic<std::int64_t> dmaDone_{ 0 };
  std::atomic<std::int64_t> copiedPieces_[slots];
  std::atomic<bool> abort_{ false };
  std::mutex failureMutex_; // also guards the transfer's bounds
  std::exception_ptr failure_;

  int device_ = -1;
  bool kernelsReachSlots_ = false; // unified addressing: a kernel can copy a slot (issue)
  PinnedBuffer<char> ring_;
  cudaEvent_t events_[slots] = {};
};

} // namespace detail
} // namespace neighborgrid
