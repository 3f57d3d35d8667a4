// Slabs (Slabs.h). How a request is cut:
//  - Particles as their own queries: slabs of the particles along the longest axis of their
//    bounds, cut at quantiles of a sample so that they hold about as many points each. A slab
//    runs with its own particles first, then its halo: every particle outside it within R (with a
//    margin for rounding) of its box. The halo's own results are dropped; their points are
//    counted, weighed and smoothed as in one pass, so an own point's neighbors are all there.
//  - Query points (a probe): slabs of the queries; each runs with the particles within R of its
//    queries' bounds as its source.
//  - A query grid: ranges of planes along its slowest axis (Request::queryGrid::firstIndex keeps
//    every point's coordinates exactly those of the whole grid); results go straight to the
//    caller's arrays, which the planes fill contiguously.
// A slab that still does not fit (its halo, or a cluster) is cut in two at the median of its
// own points along its longest axis, until it fits or cannot be cut (then a clear error).
// SPH smoothing and the gradient need rho_j at every neighbor j, also in the halo: a density pass
// over the particles in slabs gives V_j = m_j / rho_j, and the sums run in slabs with those
// volumes (Request::particleVolumes), as a distributed run does for its halo. With per-particle
// radii (Request::radii) the halo is as wide as the largest radius and each slab runs the radius
// layer (Radii.h) on its points.
//
// Where every point fits the device at once, a request of more points than a run takes is cut
// and gathered there instead (SlabBackend::runResident, cuda/ResidentSlabs.h).
// Overlap: a helper thread gathers the next slab's points and arrays and scatters the last
// slab's results while the backend works on the current slab (for CUDA: its upload, sort,
// search and download).
// Host passes: each pass over the particles reads all of them (26 GB at 2.2e9 points). The first
// slabs are counted up front, and each slab's gather is one branch-free write pass into pages
// faulted in beforehand by the threads that fill them; its result arrays are faulted in by the
// gather too, off the run's download.
#include "Slabs.h"

#include "Backend.h"
#include "Parallel.h"
#include "Radii.h"
#include "Timer.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <future>
#include <memory>
#include <new>
#include <sstream>
#include <type_traits>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace neighborgrid
{
namespace detail
{
namespace
{


struct Box
{
  double lo[3] = { -HUGE_VAL, -HUGE_VAL, -HUGE_VAL };
  double hi[3] = { HUGE_VAL, HUGE_VAL, HUGE_VAL };
  /// This box grown by R (and the rounding margin) on every side; infinite faces stay infinite.
  Box dilated(double radius) const
  {
    Box d;
    for (int a = 0; a < 3; ++a)
    {
      d.lo[a] = std::isinf(lo[a]) ? lo[a] : lo[a] - haloMargin(lo[a], radius);
      d.hi[a] = std::isinf(hi[a]) ? hi[a] : hi[a] + haloMargin(hi[a], radius);
    }
    return d;
  }
  /// Bit a set for each axis a with a finite face.
  int boundedAxes() const
  {
    int bits = 0;
    for (int a = 0; a < 3; ++a)
    {
      bits |= (std::isinf(lo[a]) && std::isinf(hi[a])) ? 0 : 1 << a;
    }
    return bits;
  }
};

constexpr int maxStalls = 6;

enum class Mode
{
  Particles,   // the particles are the queries
  QueryPoints, // a probe's points
  QueryGrid    // a grid of queries
};

/// A partition's counts per slice (countKinds), made for several pieces in one pass.
using KindCounts = std::shared_ptr<const std::vector<std::int64_t>>;

struct Piece
{
  Box box;                                   // Particles and QueryPoints: the slab's own space
  std::int64_t gridBegin[3] = { 0, 0, 0 };  // QueryGrid: its box of grid indices, [begin, end)
  std::int64_t gridEnd[3] = { 0, 0, 0 };
  std::int64_t gridPoints() const
  {
    return (gridEnd[0] - gridBegin[0]) * (gridEnd[1] - gridBegin[1]) * (gridEnd[2] - gridBegin[2]);
  }
  std::int64_t parentParticles = -1;         // particles its parent slab ran with, when cut from one
  int stalls = 0; // cuts in a row that hardly shrank what the slab runs with
  KindCounts counts; // Particles: its own and halo points per slice, when counted with the others
};

/// Writes a byte in every page of [p, p + bytes): the pages of fresh memory are then in place
/// (the kernel zeroes them) before the writes that fill them.
inline void faultIn(void* p, std::size_t bytes)
{
  constexpr std::size_t page = 4096;
  volatile char* c = static_cast<char*>(p);
  for (std::size_t at = 0; at < bytes; at += page)
  {
    c[at] = 0;
  }
}

/// Pages for a slab's arrays. On Linux, large ones are asked for as transparent huge pages: the
/// first touch of 20 GB took 1.57 s in 4 KiB pages and 0.62 s in huge pages on the H100 machine
/// (16 threads; its kernel gives huge pages on request only).
struct HostPages
{
  void operator()(void* p) const { release(p, bytes); }
  std::size_t bytes = 0;

  static void* take(std::size_t bytes)
  {
#if defined(__linux__)
    if (bytes >= (std::size_t(64) << 20))
    {
      void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED)
      {
        std::ostringstream s;
        s << "NeighborGrid: could not allocate " << double(bytes) / double(1 << 30)
          << " GiB of host memory for a slab's points or results. Free host memory, or set a lower "
             "memory limit so that the request is cut into more, smaller slabs.";
        throw Error(s.str());
      }
      madvise(p, bytes, MADV_HUGEPAGE); // advice only: without it the pages are small
      return p;
    }
#endif
    return ::operator new(bytes);
  }
  static void release(void* p, std::size_t bytes)
  {
    if (!p)
    {
      return;
    }
#if defined(__linux__)
    if (bytes >= (std::size_t(64) << 20))
    {
      munmap(p, bytes);
      return;
    }
#endif
    ::operator delete(p);
  }
};

/// Host memory for a slab, left uninitialized: it is written once, in parallel, and its pages
/// are first touched by those writers (a serial zero fill of gigabytes cost seconds).
template <class T>
class HostArray
{
  static_assert(std::is_trivially_copyable<T>::value, "slab arrays hold plain values");

public:
  void resize(std::int64_t n)
  {
    if (n > capacity_)
    {
      data_.reset();
      const std::size_t bytes = std::max<std::size_t>(1, static_cast<std::size_t>(n) * sizeof(T));
      data_ = std::unique_ptr<T[], HostPages>(static_cast<T*>(HostPages::take(bytes)), HostPages{ bytes });
      capacity_ = n;
    }
    size_ = n;
  }
  /// Faults the array's pages in on `threads` threads, so that they are in place before a writer
  /// that cannot fault them in parallel (the transfer ring's download) gets the array.
  void touch(int threads)
  {
    parallelSlices(threads, size_, [this](int, std::int64_t begin, std::int64_t end) {
      faultIn(data_.get() + begin, std::size_t(end - begin) * sizeof(T));
    });
  }
  T* data() { return data_.get(); }
  const T* data() const { return data_.get(); }
  std::int64_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  T& operator[](std::int64_t i) { return data_[i]; }
  const T& operator[](std::int64_t i) const { return data_[i]; }

private:
  std::unique_ptr<T[], HostPages> data_;
  std::int64_t capacity_ = 0, size_ = 0;
};

/// Host time of a slab's gather, by pass (for the stages that say where the time goes).
struct GatherTimes
{
  double countMs = 0.0;
  double writeMs = 0.0; // the write pass, first touch of the slab's fresh pages included
  double valuesMs = 0.0;
};

/// A slab with its points and arrays gathered, and room for its results.
struct Prepared
{
  Piece piece;
  HostArray<std::int64_t> particles; // Particles: own points first, then the halo; else the source
  std::int64_t ownParticles = 0;
  HostArray<std::int64_t> queries;   // QueryPoints: the slab's own queries
  HostArray<char> particleXyz, queryXyz;
  HostArray<float> mass, volumes, radii;
  std::vector<HostArray<float>> values;
  HostArray<std::int32_t> count;
  HostArray<float> density;
  HostArray<std::uint8_t> valid;
  std::vector<HostArray<float>> smoothed;
  std::int64_t resultCount = 0;
  double gatherMs = 0.0; // host time to gather this slab (overlapped with the previous slab's run)
  GatherTimes times;     // ... by pass
};

/// Which of a piece's points a partition takes, without a branch per point: kind 1 or 2 (0: none)
/// = closedWeight * [p in `closed`] + openWeight * [p in `open`], `closed` with its faces,
/// `open` without its upper ones (a slab owns [lo, hi)). Slabs as first cut are
/// bounded along one axis only, and then only that coordinate is compared: 4 comparisons a point
/// instead of 12 (count pass 2.3 -> 0.9 ns a point on one core of the build machine).
struct PieceTest
{
  Box closed, open;
  int closedWeight = 0, openWeight = 0;
  int axis = -1; // the one axis both boxes are bounded along, or -1

  PieceTest(const Box& closedBox, int closedW, const Box& openBox, int openW)
    : closed(closedBox), open(openBox), closedWeight(closedW), openWeight(openW)
  {
    const int bits = (closedW ? closed.boundedAxes() : 0) | (openW ? open.boundedAxes() : 0);
    for (int a = 0; a < 3; ++a)
    {
      axis = bits == 1 << a ? a : axis;
    }
  }
  template <class T>
  int operator()(const T* p) const
  {
    if (axis >= 0)
    {
      const double v = double(p[axis]);
      return closedWeight * ((closed.lo[axis] <= v) & (v <= closed.hi[axis])) +
        openWeight * ((open.lo[axis] <= v) & (v < open.hi[axis]));
    }
    int in[2] = { 1, 1 };
    for (int a = 0; a < 3; ++a)
    {
      const double v = double(p[a]);
      in[0] &= (closed.lo[a] <= v) & (v <= closed.hi[a]);
      in[1] &= (open.lo[a] <= v) & (v < open.hi[a]);
    }
    return closedWeight * in[0] + openWeight * in[1];
  }
};

/// The slices a partition's passes cut the points into: the same for every pass, so that counts
/// made in one pass (for several pieces at once) serve the writes of each piece later.
struct Slicing
{
  int slices = 1;
  std::int64_t size = 1;
  Slicing(std::int64_t n, int threads)
    : slices(static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>(4 * threads, n / 65536)))),
      size(std::max<std::int64_t>(1, (n + slices - 1) / slices))
  {
  }
};

/// Per slice, the points of kind 1 and of kind 2 under each test: counts[t][2 * slice] and
/// counts[t][2 * slice + 1]. Each test reads the slice again: the cost is one read of the points
/// per test (blocks of 16K points that every test took in turn, read once, were 12% slower on the
/// build machine, where the loop is bound by its compares, and were not measured on the GPU
/// machine's host).
template <class T>
std::vector<std::vector<std::int64_t>> countKinds(
  const T* from, std::int64_t n, int threads, const std::vector<PieceTest>& tests)
{
  const Slicing cut(n, threads);
  std::vector<std::vector<std::int64_t>> counts(tests.size(), std::vector<std::int64_t>(2 * std::size_t(cut.slices)));
  parallelSlices(threads, cut.slices, [&](int, std::int64_t first, std::int64_t last) {
    for (std::int64_t slice = first; slice < last; ++slice)
    {
      const std::int64_t begin = slice * cut.size, end = std::min(n, (slice + 1) * cut.size);
      for (std::size_t t = 0; t < tests.size(); ++t)
      {
        const PieceTest test = tests[t];
        std::int64_t ofFirst = 0, ofSecond = 0;
        for (std::int64_t i = begin; i < end; ++i)
        {
          const int kind = test(from + 3 * i);
          ofFirst += kind == 1;
          ofSecond += kind == 2;
        }
        counts[t][2 * slice] = ofFirst;
        counts[t][2 * slice + 1] = ofSecond;
      }
    }
  });
  return counts;
}

/// The points of kind 1 under `test`, then those of kind 2, each in ascending order: their indices
/// into `indices` and their coordinates (as given) into `xyz`; `counts` from countKinds. Returns
/// the number of the first kind.
///
/// No branch per point, and nothing shared between threads: the destination is picked by kind
/// from a table whose kind-0 entry is the thread's own scratch. With a branch per point (half of
/// them mispredicted) or a scratch slot shared by threads, this pass took 2.6-4.3 s for a slab of
/// 1.1e9 of 2.2e9 points on the H100 machine's 16 threads (RESULTS.md, issue 21).
template <class T>
std::int64_t writeKinds(const T* from, std::int64_t n, int threads, const PieceTest& test,
  const std::vector<std::int64_t>& counts, HostArray<std::int64_t>& indices, HostArray<char>& xyz)
{
  const Slicing cut(n, threads);
  std::int64_t firstKind = 0, total = 0;
  for (int slice = 0; slice < cut.slices; ++slice)
  {
    firstKind += counts[2 * slice];
    total += counts[2 * slice] + counts[2 * slice + 1];
  }
  std::vector<std::int64_t> offsets(2 * std::size_t(cut.slices) + 2);
  std::int64_t at[2] = { 0, firstKind };
  for (int slice = 0; slice <= cut.slices; ++slice)
  {
    for (int kind = 0; kind < 2; ++kind)
    {
      offsets[2 * slice + kind] = at[kind];
      at[kind] += slice < cut.slices ? counts[2 * slice + kind] : 0;
    }
  }
  indices.resize(total);
  xyz.resize(total * 3 * static_cast<std::int64_t>(sizeof(T)));
  T* to = reinterpret_cast<T*>(xyz.data());
  std::int64_t* index = indices.data();
  std::atomic<bool> mismatch{ false };
  parallelSlices(std::min(threads, cut.slices), cut.slices, [&](int, std::int64_t first, std::int64_t last) {
    // The thread first faults in the fresh pages it will write (page faults inside the loop below
    // cost more: 4.3 s against 0.9 + 2.6 s for a slab of 1.1e9 points on the H100 machine).
    for (int kind = 0; kind < 2; ++kind)
    {
      const std::int64_t a = offsets[2 * first + kind], b = offsets[2 * last + kind];
      faultIn(index + a, std::size_t(b - a) * sizeof(std::int64_t));
      faultIn(to + 3 * a, std::size_t(b - a) * 3 * sizeof(T));
    }
    std::int64_t scratchIndex = 0;
    T scratchXyz[3] = { 0, 0, 0 };
    std::int64_t* const indexBase[3] = { &scratchIndex, index, index };
    T* const xyzBase[3] = { scratchXyz, to, to };
    for (std::int64_t slice = first; slice < last; ++slice)
    {
      std::int64_t next[3] = { 0, offsets[2 * slice], offsets[2 * slice + 1] };
      const std::int64_t end = std::min(n, (slice + 1) * cut.size);
      for (std::int64_t i = slice * cut.size; i < end; ++i)
      {
        const int kind = test(from + 3 * i);
        const std::int64_t k = next[kind];
        indexBase[kind][k] = i;
        T* const at3 = xyzBase[kind] + 3 * k;
        at3[0] = from[3 * i];
        at3[1] = from[3 * i + 1];
        at3[2] = from[3 * i + 2];
        next[kind] = k + (kind != 0);
      }
      if (next[1] != offsets[2 * slice + 2] || next[2] != offsets[2 * slice + 3])
      {
        mismatch = true; // counts made for another test or other points: never with countKinds's
      }
    }
  });
  if (mismatch)
  {
    throw Error("NeighborGrid: internal error: a slab's points changed between their count and their gather");
  }
  return firstKind;
}

/// The points of kind 1 under `test`, then those of kind 2 (writeKinds), counted first unless
/// `counts` holds them already.
std::int64_t partitionPoints(const Points& points, int threads, const PieceTest& test, const KindCounts& counts,
  HostArray<std::int64_t>& indices, HostArray<char>& xyz, GatherTimes& times)
{
  auto partition = [&](const auto* from) {
    Timer countTime;
    const std::vector<std::int64_t> counted =
      counts ? *counts : std::move(countKinds(from, points.count, threads, { test }).front());
    times.countMs += countTime.milliseconds();
    Timer writeTime;
    const std::int64_t first = writeKinds(from, points.count, threads, test, counted, indices, xyz);
    times.writeMs += writeTime.milliseconds();
    return first;
  };
  return points.type == ScalarType::Float64 ? partition(static_cast<const double*>(points.xyz))
                                            : partition(static_cast<const float*>(points.xyz));
}

void gatherValues(const float* values, int components, const HostArray<std::int64_t>& indices, int threads,
  HostArray<float>& out)
{
  const std::int64_t count = indices.size();
  out.resize(count * components);
  parallelSlices(threads, count, [&](int, std::int64_t begin, std::int64_t end) {
    for (std::int64_t k = begin; k < end; ++k)
    {
      std::copy(values + indices[k] * components, values + (indices[k] + 1) * components, out.data() + k * components);
    }
  });
}

/// Up to 2^20 values along `axis` of the points listed (all points when `indices` is null),
/// evenly strided, sorted.
std::vector<double> sortedSample(
  const Points& p, const HostArray<std::int64_t>* indices, std::int64_t count, int axis, int threads)
{
  const std::int64_t wanted = std::min<std::int64_t>(count, std::int64_t(1) << 20);
  std::vector<double> sample(static_cast<std::size_t>(wanted));
  // Reads spread over gigabytes, each a cache and TLB miss: on all threads.
  parallelSlices(std::max(1, threads), wanted, [&](int, std::int64_t begin, std::int64_t end) {
    for (std::int64_t k = begin; k < end; ++k)
    {
      const std::int64_t at = static_cast<std::int64_t>((double(k) + 0.5) * double(count) / double(wanted));
      sample[k] = coordinateOf(p, indices ? (*indices)[at] : at, axis);
    }
  });
  std::sort(sample.begin(), sample.end());
  return sample;
}

int longestAxis(const double lo[3], const double hi[3])
{
  int axis = 0;
  for (int a = 1; a < 3; ++a)
  {
    if (hi[a] - lo[a] > hi[axis] - lo[axis])
    {
      axis = a;
    }
  }
  return axis;
}

void mergeReport(Report& total, const Report& part, bool takeIdentity)
{
  if (takeIdentity)
  {
    total.backend = part.backend;
    total.method = part.method;
    total.device = part.device;
    total.backendReason = part.backendReason;
  }
  for (const StageTime& s : part.stages)
  {
    addStage(total, s.stage, s.milliseconds);
  }
  total.pairsDecidedInDouble += part.pairsDecidedInDouble;
  total.extraDeviceBytes = std::max(total.extraDeviceBytes, part.extraDeviceBytes);
  total.slabs += part.slabs;
  total.slabHaloPoints += part.slabHaloPoints;
}

/// How far a slab's halo reaches: R, or with per-particle radii the largest one (every mode takes
/// a pair within max(R_i, R_j) at most).
double haloRadius(const Request& r, int threads)
{
  return r.radii ? largestRadiusOf(r, threads) : r.radius;
}

std::string bytesText(std::int64_t bytes)
{
  std::ostringstream s;
  s.precision(3);
  s << double(bytes) / double(1 << 20) << " MiB";
  return s.str();
}

class SlabRun
{
public:
  SlabRun(const Request& request, const SlabBackend& backend, double progressBase, double progressSpan)
    : r_(request), backend_(backend), base_(progressBase), span_(progressSpan),
      reach_(haloRadius(request, backend.threads)),
      outputsPerComponent_(request.operation == Operation::Gradient ? 3 : 1)
  {
    const bool separate = hasSeparateSource(request);
    particles_ = separate ? request.source : request.points;
    mode_ = !separate ? Mode::Particles : request.queryGrid.empty() ? Mode::QueryPoints : Mode::QueryGrid;
    results_ = mode_ == Mode::Particles ? particles_.count : queryCount(request);
    if (mode_ == Mode::QueryGrid)
    {
      // The slowest axis with more than one point: its planes are contiguous in the output.
      gridAxis_ = 0;
      for (int a = 2; a > 0; --a)
      {
        if (request.queryGrid.dimensions[a] > 1)
        {
          gridAxis_ = a;
          break;
        }
      }
    }
  }

  /// particleLo, particleHi: the bounds of the particles (slabsFor found them).
  Report run(int slabs, const double particleLo[3], const double particleHi[3])
  {
    Timer cutting;
    std::deque<Piece> todo = initialPieces(slabs, particleLo, particleHi);
    Report total;
    addStage(total, "slabs: bounds and cuts", cutting.milliseconds());
    Timer counting;
    countTogether(todo);
    GatherTimes passes;
    passes.countMs = counting.milliseconds();
    total.slabs = 0;
    std::int64_t largest = -1, done = 0, sourceRuns = 0;
    Timer waited;
    double waitedMs = 0.0;

    auto prepareAsync = [&](const Piece& piece) {
      return std::async(std::launch::async, [this, piece] { return prepare(piece); });
    };
    std::future<std::unique_ptr<Prepared>> next;
    if (!todo.empty())
    {
      next = prepareAsync(todo.front());
      todo.pop_front();
    }
    std::future<void> scattering;
    double gatherMs = passes.countMs;
    while (next.valid())
    {
      Timer wait;
      std::unique_ptr<Prepared> current = next.get();
      waitedMs += wait.milliseconds();
      gatherMs += current->gatherMs;
      passes.countMs += current->times.countMs;
      passes.writeMs += current->times.writeMs;
      passes.valuesMs += current->times.valuesMs;
      if (!todo.empty())
      {
        next = prepareAsync(todo.front());
        todo.pop_front();
      }
      if (current->resultCount == 0)
      {
        continue;
      }
      Report part;
      try
      {
        part = runPiece(*current, done);
      }
      catch (const DoesNotFit& tooBig)
      {
        Piece halves[2];
        // Cuts that keep failing to shrink what a slab runs with (its halo outweighs it, or a
        // cluster lies within R of all its queries) stop after a few tries on every axis.
        const bool shrank = current->piece.parentParticles < 0 ||
          double(current->particles.size()) < 0.9 * double(current->piece.parentParticles);
        const int stalls = shrank ? 0 : current->piece.stalls + 1;
        if (stalls > maxStalls || !split(*current, halves))
        {
          std::ostringstream s;
          s << "NeighborGrid: the request does not fit even cut into slabs: a slab of " << current->resultCount
            << " result points and " << current->particles.size()
            << " particles (its own and those within R of it) cannot be cut further: its points share their "
               "position along every axis, a cut no longer shrinks it (R is large against the memory), or a "
               "single grid plane is too large. Raise the memory limit, or use a smaller radius. "
            << tooBig.what();
          throw Error(s.str());
        }
        halves[0].stalls = halves[1].stalls = stalls;
        todo.push_front(halves[1]);
        todo.push_front(halves[0]);
        if (!next.valid())
        {
          next = prepareAsync(todo.front());
          todo.pop_front();
        }
        continue;
      }
      done += current->resultCount;
      sourceRuns += current->particles.size();
      mergeReport(total, part, current->resultCount > largest && !part.device.empty());
      largest = std::max(largest, current->resultCount);
      if (scattering.valid())
      {
        Timer waitScatter;
        scattering.get();
        waitedMs += waitScatter.milliseconds();
      }
      if (mode_ != Mode::QueryGrid || !contiguous(current->piece))
      {
        scattering = std::async(std::launch::async, [this, owned = std::move(current)] {
          Timer scatterTime;
          scatter(*owned);
          scatterMs_ += scatterTime.milliseconds();
        });
      }
    }
    Timer finish;
    if (scattering.valid())
    {
      scattering.get();
    }
    waitedMs += finish.milliseconds();
    addStage(total, "slabs: waiting for host gather and scatter", waitedMs);
    // Host work overlapped with the device (or waited for, above): for finding where time goes.
    addStage(total, "slabs: host gather (all slabs)", gatherMs);
    addStage(total, "slabs: host gather, counting passes", passes.countMs);
    addStage(total, "slabs: host gather, writing passes", passes.writeMs);
    addStage(total, "slabs: host gather, arrays", passes.valuesMs);
    addStage(total, "slabs: host scatter (all slabs)", scatterMs_);
    total.slabHaloPoints = std::max<std::int64_t>(0, sourceRuns - particles_.count);
    if (r_.operation == Operation::NeighborCount)
    {
      total.neighborPairs = sumCounts();
    }
    return total;
  }

private:
  std::deque<Piece> initialPieces(int slabs, const double particleLo[3], const double particleHi[3])
  {
    std::deque<Piece> pieces;
    if (mode_ == Mode::QueryGrid)
    {
      const std::int64_t planes = r_.queryGrid.dimensions[gridAxis_];
      const std::int64_t count = std::min<std::int64_t>(slabs, planes);
      for (std::int64_t k = 0; k < count; ++k)
      {
        Piece p;
        for (int a = 0; a < 3; ++a)
        {
          p.gridEnd[a] = r_.queryGrid.dimensions[a];
        }
        p.gridBegin[gridAxis_] = planes * k / count;
        p.gridEnd[gridAxis_] = planes * (k + 1) / count;
        pieces.push_back(p);
      }
      return pieces;
    }
    const Points& points = mode_ == Mode::Particles ? particles_ : r_.points;
    double lo[3], hi[3];
    if (mode_ == Mode::Particles)
    {
      std::copy(particleLo, particleLo + 3, lo); // a second pass over 26 GB cost 0.2-0.3 s at 2.2e9 points
      std::copy(particleHi, particleHi + 3, hi);
    }
    else
    {
      findBoundsOnHost(points, backend_.threads, lo, hi);
    }
    const int axis = longestAxis(lo, hi);
    const std::vector<double> sample = sortedSample(points, nullptr, points.count, axis, backend_.threads);
    Piece current;
    for (int k = 1; k < slabs; ++k)
    {
      const double cut = sample[sample.size() * k / slabs];
      if (cut > current.box.lo[axis] && cut > lo[axis])
      {
        Piece below = current;
        below.box.hi[axis] = cut;
        pieces.push_back(below);
        current.box.lo[axis] = cut;
      }
    }
    pieces.push_back(current);
    return pieces;
  }

  /// A slab's own particles (kind 1) and its halo (kind 2): those within R of its box, with the
  /// margin for rounding. Own points lie in the halo's box too: 2 - 1 makes them kind 1.
  PieceTest particleTest(const Piece& piece) const { return PieceTest(piece.box.dilated(reach_), 2, piece.box, -1); }

  /// The first slabs of the particles, counted up front in one parallel step, before the first
  /// gather (each slab's count reads every point: 26 GB at 2.2e9 points, 0.9 s a slab on the H100
  /// machine). This takes the second slab's count off its gather, which runs beside the first
  /// slab's run, and puts it before the first gather; measured only together with the rest of
  /// the gather's changes (RESULTS.md, "Slabs: the host gather").
  void countTogether(std::deque<Piece>& pieces) const
  {
    if (mode_ != Mode::Particles || pieces.size() < 2)
    {
      return;
    }
    std::vector<PieceTest> tests;
    for (const Piece& piece : pieces)
    {
      tests.push_back(particleTest(piece));
    }
    const int threads = backend_.threads;
    const std::int64_t n = particles_.count;
    std::vector<std::vector<std::int64_t>> counts = particles_.type == ScalarType::Float64
      ? countKinds(static_cast<const double*>(particles_.xyz), n, threads, tests)
      : countKinds(static_cast<const float*>(particles_.xyz), n, threads, tests);
    for (std::size_t k = 0; k < pieces.size(); ++k)
    {
      pieces[k].counts = std::make_shared<const std::vector<std::int64_t>>(std::move(counts[k]));
    }
  }

  /// The bounds of a piece of the grid, in the grid's own coordinates.
  Box gridBox(const Piece& piece) const
  {
    const QueryGrid& g = r_.queryGrid;
    Box b;
    for (int a = 0; a < 3; ++a)
    {
      const std::int64_t first = g.firstIndex[a] + piece.gridBegin[a];
      const std::int64_t last = g.firstIndex[a] + piece.gridEnd[a] - 1;
      const double u = gridCoordinate(g.origin[a], first, g.spacing[a]);
      const double v = gridCoordinate(g.origin[a], last, g.spacing[a]);
      b.lo[a] = std::min(u, v);
      b.hi[a] = std::max(u, v);
    }
    return b;
  }

  std::unique_ptr<Prepared> prepare(const Piece& piece) const
  {
    Timer gatherTime;
    auto out = std::make_unique<Prepared>();
    Prepared& p = *out;
    p.piece = piece;
    const int threads = backend_.threads;
    const double radius = reach_;
    if (mode_ == Mode::Particles)
    {
      p.ownParticles = partitionPoints(particles_, threads, particleTest(piece), piece.counts, p.particles,
        p.particleXyz, p.times);
      p.resultCount = p.ownParticles;
    }
    else
    {
      Box reach;
      if (mode_ == Mode::QueryPoints)
      {
        const Points& q = r_.points;
        p.resultCount = partitionPoints(q, threads, PieceTest(Box(), 0, piece.box, 1), nullptr, p.queries, p.queryXyz, p.times);
        if (p.resultCount == 0)
        {
          p.gatherMs = gatherTime.milliseconds();
          return out;
        }
        Box own;
        Points gathered;
        gathered.xyz = p.queryXyz.data();
        gathered.count = p.resultCount;
        gathered.type = q.type;
        findBoundsOnHost(gathered, threads, own.lo, own.hi);
        reach = own.dilated(radius);
      }
      else
      {
        p.resultCount = piece.gridPoints();
        reach = gridBox(piece).dilated(radius);
      }
      p.ownParticles = partitionPoints(particles_, threads, PieceTest(reach, 1, Box(), 0), nullptr, p.particles, p.particleXyz,
        p.times);
    }
    const std::int64_t n = p.particles.size();
    if (n == 0 || n > maxPointsPerRun || p.resultCount > maxPointsPerRun)
    {
      p.gatherMs = gatherTime.milliseconds();
      return out; // runPiece fills results without neighbors, or asks for a cut
    }
    Timer valuesTime;
    if (r_.particleVolumes)
    {
      gatherValues(r_.particleVolumes, 1, p.particles, threads, p.volumes);
    }
    else if (r_.mass && operationUsesMass(r_.operation, r_.normalization))
    {
      gatherValues(r_.mass, 1, p.particles, threads, p.mass);
    }
    if (r_.radii)
    {
      gatherValues(r_.radii, 1, p.particles, threads, p.radii);
    }
    if (r_.operation == Operation::Smoothing || r_.operation == Operation::Gradient)
    {
      p.values.resize(r_.smoothed.size());
      for (std::size_t a = 0; a < r_.smoothed.size(); ++a)
      {
        gatherValues(r_.smoothed[a].values, r_.smoothed[a].components, p.particles, threads, p.values[a]);
      }
    }
    p.times.valuesMs = valuesTime.milliseconds();
    sizeResults(p, true);
    p.gatherMs = gatherTime.milliseconds();
    return out;
  }

  /// A piece of the grid that is contiguous in the output: its run writes there directly.
  bool writesDirectly(const Prepared& p) const { return mode_ == Mode::QueryGrid && contiguous(p.piece); }

  /// The slab's result arrays for a run that does not write to the caller's arrays directly,
  /// with their pages first touched on all threads where `touch` (in prepare, beside the previous
  /// slab's run: the download of 1.1e9 densities into fresh pages took 0.9 s on the H100 machine).
  void sizeResults(Prepared& p, bool touch) const
  {
    if (writesDirectly(p))
    {
      return;
    }
    const std::int64_t runResults = mode_ == Mode::Particles ? p.particles.size() : p.resultCount;
    const int threads = touch ? backend_.threads : 0;
    auto size = [threads](auto& array, std::int64_t count) {
      array.resize(count);
      if (threads > 0)
      {
        array.touch(threads);
      }
    };
    size(p.count, r_.neighborCount ? runResults : 0);
    size(p.density, r_.density ? runResults : 0);
    size(p.valid, r_.valid ? runResults : 0);
    p.smoothed.resize(r_.smoothed.size());
    for (std::size_t a = 0; a < r_.smoothed.size(); ++a)
    {
      size(p.smoothed[a], runResults * width(a));
    }
  }

  /// Runs one slab; throws DoesNotFit when it is too large for one run.
  Report runPiece(Prepared& p, std::int64_t done)
  {
    const std::int64_t sources = p.particles.size();
    const std::int64_t runResults = mode_ == Mode::Particles ? sources : p.resultCount;
    if (sources > maxPointsPerRun || runResults > maxPointsPerRun)
    {
      std::ostringstream s;
      s << "a slab of " << std::max(sources, runResults) << " points is more than one run takes (2^31 - 2)";
      throw DoesNotFit(s.str(), 0, 0);
    }
    // A piece of the grid that is contiguous in the output writes there; others are scattered.
    const bool direct = writesDirectly(p);
    const std::int64_t* dims = r_.queryGrid.dimensions;
    const std::int64_t offset = !direct ? 0
                                        : p.piece.gridBegin[0] +
        dims[0] * (p.piece.gridBegin[1] + dims[1] * p.piece.gridBegin[2]);
    sizeResults(p, false); // sized in prepare already; every entry is written by the run (or below)
    auto output = [&](auto* callers, auto& mine, std::int64_t components) {
      return direct ? (callers ? callers + offset * components : nullptr) : (callers ? mine.data() : nullptr);
    };
    std::int32_t* count = output(r_.neighborCount, p.count, 1);
    float* density = output(r_.density, p.density, 1);
    std::uint8_t* valid = output(r_.valid, p.valid, 1);
    std::vector<float*> smoothed;
    for (std::size_t a = 0; a < r_.smoothed.size(); ++a)
    {
      smoothed.push_back(direct ? r_.smoothed[a].output + offset * width(a) : p.smoothed[a].data());
    }

    if (sources == 0)
    {
      // No particle within R of these queries: the values a run gives a query without neighbors.
      for (std::int64_t k = 0; k < runResults; ++k)
      {
        if (count)
        {
          count[k] = 0;
        }
        if (density)
        {
          density[k] = 0.0f;
        }
        if (valid)
        {
          valid[k] = 0;
        }
        for (std::size_t a = 0; a < smoothed.size(); ++a)
        {
          std::fill(smoothed[a] + k * width(a), smoothed[a] + (k + 1) * width(a), r_.nullValue);
        }
      }
      Report empty;
      empty.slabs = 0;
      return empty;
    }

    Request s = r_;
    const ScalarType particleType = particles_.type;
    Points gathered;
    gathered.xyz = p.particleXyz.data();
    gathered.count = sources;
    gathered.type = particleType;
    if (mode_ == Mode::Particles)
    {
      s.points = gathered;
      s.source = Points();
      s.queryGrid = QueryGrid();
    }
    else
    {
      s.source = gathered;
      if (mode_ == Mode::QueryPoints)
      {
        s.points.xyz = p.queryXyz.data();
        s.points.count = p.resultCount;
        s.points.type = r_.points.type;
      }
      else
      {
        s.points = Points();
        for (int a = 0; a < 3; ++a)
        {
          s.queryGrid.dimensions[a] = p.piece.gridEnd[a] - p.piece.gridBegin[a];
          s.queryGrid.firstIndex[a] += p.piece.gridBegin[a];
        }
      }
    }
    s.mass = p.mass.empty() ? nullptr : p.mass.data();
    s.particleVolumes = p.volumes.empty() ? nullptr : p.volumes.data();
    s.radii = r_.radii ? p.radii.data() : nullptr;
    for (std::size_t a = 0; a < s.smoothed.size(); ++a)
    {
      s.smoothed[a].values = p.values[a].data();
      s.smoothed[a].output = smoothed[a];
    }
    s.neighborCount = count;
    s.density = density;
    s.valid = valid;
    const double total = double(std::max<std::int64_t>(1, results_));
    if (r_.progress)
    {
      const double share = double(p.resultCount) / total;
      const double before = double(done) / total;
      s.progress = [this, share, before](double fraction, const char* stage) {
        return r_.progress(base_ + span_ * (before + share * fraction), stage);
      };
    }
    Report report = backend_.runOnce(s);
    report.slabs = 1;
    return report;
  }

  /// Cuts a slab that did not fit in two halves of its own points; false when it cannot.
  bool split(const Prepared& p, Piece halves[2]) const
  {
    if (mode_ == Mode::QueryGrid)
    {
      // The axis of the piece's longest side that has two points or more.
      int axis = -1;
      double longest = -1.0;
      for (int a = 0; a < 3; ++a)
      {
        const std::int64_t points = p.piece.gridEnd[a] - p.piece.gridBegin[a];
        const double side = double(points - 1) * std::fabs(r_.queryGrid.spacing[a]);
        if (points >= 2 && side > longest)
        {
          axis = a;
          longest = side;
        }
      }
      if (axis < 0)
      {
        return false;
      }
      const std::int64_t middle = (p.piece.gridBegin[axis] + p.piece.gridEnd[axis]) / 2;
      halves[0] = halves[1] = p.piece;
      halves[0].parentParticles = halves[1].parentParticles = p.particles.size();
      halves[0].gridEnd[axis] = middle;
      halves[1].gridBegin[axis] = middle;
      return true;
    }
    const Points& points = mode_ == Mode::Particles ? particles_ : r_.points;
    const HostArray<std::int64_t>& own = mode_ == Mode::Particles ? p.particles : p.queries;
    const std::int64_t count = mode_ == Mode::Particles ? p.ownParticles : p.resultCount;
    if (count < 2)
    {
      return false;
    }
    // Longest axis of a sample of the own points; the median, or the next larger sample value.
    std::vector<double> samples[3];
    double lo[3], hi[3];
    for (int a = 0; a < 3; ++a)
    {
      samples[a] = sortedSample(points, &own, count, a, backend_.threads);
      lo[a] = samples[a].front();
      hi[a] = samples[a].back();
    }
    int order[3] = { 0, 1, 2 };
    std::sort(order, order + 3, [&](int a, int b) { return hi[a] - lo[a] > hi[b] - lo[b]; });
    for (int axis : order)
    {
      const std::vector<double>& s = samples[axis];
      auto cut = s.begin() + static_cast<std::ptrdiff_t>(s.size() / 2);
      if (*cut == s.front())
      {
        cut = std::upper_bound(s.begin(), s.end(), s.front());
      }
      if (cut == s.end())
      {
        continue;
      }
      halves[0] = halves[1] = p.piece;
      halves[0].parentParticles = halves[1].parentParticles = p.particles.size();
      halves[0].counts = halves[1].counts = nullptr;
      halves[0].box.hi[axis] = *cut;
      halves[1].box.lo[axis] = *cut;
      return true;
    }
    return false;
  }

  /// Whether a piece of the grid is one run of the output: the axes below some axis whole, those
  /// above it one index wide.
  bool contiguous(const Piece& piece) const
  {
    const std::int64_t* dims = r_.queryGrid.dimensions;
    for (int m = 0; m < 3; ++m)
    {
      bool ok = true;
      for (int a = 0; a < 3; ++a)
      {
        const std::int64_t size = piece.gridEnd[a] - piece.gridBegin[a];
        ok = ok && (a < m ? size == dims[a] : a > m ? size == 1 : true);
      }
      if (ok)
      {
        return true;
      }
    }
    return false;
  }

  void scatter(const Prepared& p) const
  {
    const bool grid = mode_ == Mode::QueryGrid;
    const HostArray<std::int64_t>& targets = mode_ == Mode::Particles ? p.particles : p.queries;
    const std::int64_t* dims = r_.queryGrid.dimensions;
    const std::int64_t* from = p.piece.gridBegin;
    const std::int64_t sizeX = p.piece.gridEnd[0] - from[0], sizeY = p.piece.gridEnd[1] - from[1];
    parallelSlices(backend_.threads, p.resultCount, [&](int, std::int64_t begin, std::int64_t end) {
      for (std::int64_t k = begin; k < end; ++k)
      {
        const std::int64_t to = !grid ? targets[k]
                                      : (from[0] + k % sizeX) +
            dims[0] * ((from[1] + (k / sizeX) % sizeY) + dims[1] * (from[2] + k / (sizeX * sizeY)));
        if (r_.neighborCount)
        {
          r_.neighborCount[to] = p.count[k];
        }
        if (r_.density)
        {
          r_.density[to] = p.density[k];
        }
        if (r_.valid)
        {
          r_.valid[to] = p.valid[k];
        }
        for (std::size_t a = 0; a < p.smoothed.size(); ++a)
        {
          const std::int64_t c = width(a);
          std::copy(p.smoothed[a].data() + k * c, p.smoothed[a].data() + (k + 1) * c, r_.smoothed[a].output + to * c);
        }
      }
    });
  }

  std::int64_t sumCounts() const { return parallelSum(backend_.threads, r_.neighborCount, results_); }

  /// Output floats per point of smoothed array a (the gradient: 3 per component).
  std::int64_t width(std::size_t a) const { return std::int64_t(r_.smoothed[a].components) * outputsPerComponent_; }

  const Request& r_;
  const SlabBackend& backend_;
  double base_, span_;
  double reach_; // the halo's width: R, or the largest per-particle radius
  int outputsPerComponent_;
  Points particles_;
  double scatterMs_ = 0.0; // written by one scatter at a time, read after the last is joined
  Mode mode_ = Mode::Particles;
  std::int64_t results_ = 0;
  int gridAxis_ = 2;
};

/// Slabs to start with: the memory a run needs (the backend's fixed scratch, the need of a run
/// of one point, plus the rest in proportion to its share of the request) against the memory a
/// run can have; lo and hi get the particles' bounds. Throws when no slab could fit.
int slabsFor(const Request& r, const SlabBackend& backend, double lo[3], double hi[3])
{
  const bool separate = hasSeparateSource(r);
  const Points& particles = separate ? r.source : r.points;
  const std::int64_t queries = queryCount(r);
  findBoundsOnHost(particles, backend.threads, lo, hi);
  Request tiny = r;
  (separate ? tiny.source : tiny.points).count = 1;
  if (separate && r.queryGrid.empty())
  {
    tiny.points.count = 1;
  }
  const double whole = double(backend.bytesNeeded(r, lo, hi));
  const double fixed = std::min(whole, double(backend.bytesNeeded(tiny, lo, hi)));
  const double perShare = std::max(1.0, whole - fixed);
  const double usable = 0.8 * double(std::max<std::int64_t>(1, backend.bytesAvailable()));
  if (fixed >= 0.9 * usable)
  {
    std::ostringstream s;
    s << "NeighborGrid: the memory a run can have (" << bytesText(backend.bytesAvailable())
      << ", the engine's memory limit or the device's free memory) is below what any run of this request needs: "
      << bytesText(static_cast<std::int64_t>(fixed)) << " of fixed scratch, and about "
      << bytesText(static_cast<std::int64_t>(whole)) << " for all " << particles.count
      << " points in one run. Raise the memory limit";
    throw Error(s.str());
  }
  const double perRun = 0.9 * double(pointsPerRun());
  const double slabs = std::max({ 2.0, std::ceil(perShare / (usable - fixed)),
    std::ceil(double(particles.count) / perRun), std::ceil(double(queries) / perRun) });
  // Slabs thinner than 2R (R: the halo's width) would each run with more halo than points of their own.
  const double extent = hi[longestAxis(lo, hi)] - lo[longestAxis(lo, hi)];
  if (slabs > 4.0 && extent / slabs < 2.0 * haloRadius(r, backend.threads))
  {
    std::ostringstream s;
    s << "NeighborGrid: the memory a run can have (" << bytesText(backend.bytesAvailable())
      << ", the engine's memory limit or the device's free memory) would need " << slabs << " slabs, thinner than 2R"
      << (r.radii ? " (R: the largest radius)" : "") << ", for this request (about "
      << bytesText(static_cast<std::int64_t>(whole))
      << " in one run): each would run with more points within R of it than its own. Raise the memory limit";
    throw Error(s.str());
  }
  return static_cast<int>(std::min(slabs, 65536.0));
}

Report runPieces(const Request& r, const SlabBackend& backend, double base, double span)
{
  const bool weighs = r.operation == Operation::Gradient ||
    (r.operation == Operation::Smoothing && r.normalization == Normalization::SPH);
  if (!weighs || r.particleVolumes)
  {
    Timer bounds;
    double lo[3], hi[3];
    const int slabs = slabsFor(r, backend, lo, hi);
    const double boundsMs = bounds.milliseconds();
    Report total = SlabRun(r, backend, base, span).run(slabs, lo, hi);
    addStage(total, "slabs: bounds and cuts", boundsMs);
    return total;
  }
  // SPH smoothing and the gradient: rho_j of every particle first (a halo point's own halo lies
  // beyond the slab's), then the sums with V_j = m_j / rho_j.
  const bool separate = hasSeparateSource(r);
  const Points particles = separate ? r.source : r.points;
  HostArray<float> rho;
  rho.resize(particles.count);
  Request density = r;
  density.points = particles;
  density.source = Points();
  density.queryGrid = QueryGrid();
  density.operation = Operation::Density;
  density.smoothed.clear();
  density.neighborCount = nullptr;
  density.valid = nullptr;
  density.density = rho.data();
  Report total = runFitting(density, backend, base, span / 2);

  HostArray<float> volumes;
  volumes.resize(particles.count);
  parallelSlices(backend.threads, particles.count, [&](int, std::int64_t begin, std::int64_t end) {
    for (std::int64_t j = begin; j < end; ++j)
    {
      volumes[j] = (r.mass ? r.mass[j] : static_cast<float>(r.constantMass)) / rho[j];
    }
  });
  Request smoothing = r;
  smoothing.particleVolumes = volumes.data();
  smoothing.density = nullptr;
  const Report second = runFitting(smoothing, backend, base + span / 2, r.density && separate ? span / 4 : span / 2);
  mergeReport(total, second, true);
  if (r.density && !separate)
  {
    std::copy(rho.data(), rho.data() + rho.size(), r.density);
  }
  else if (r.density)
  {
    Request queryDensity = r;
    queryDensity.operation = Operation::Density;
    queryDensity.smoothed.clear();
    queryDensity.valid = nullptr;
    mergeReport(total, runFitting(queryDensity, backend, base + 0.75 * span, span / 4), false);
  }
  return total;
}

} // namespace

double haloMargin(double face, double radius)
{
  return radius * (1.0 + 1e-9) + 1e-12 * std::fabs(face);
}

std::int64_t pointsPerRun()
{
  const char* knob = std::getenv("NEIGHBORGRID_TEST_POINTS_PER_RUN");
  const long long asked = knob ? std::atoll(knob) : 0;
  return asked > 0 ? std::min<std::int64_t>(asked, maxPointsPerRun) : maxPointsPerRun;
}

Report runFitting(const Request& r, const SlabBackend& backend, double progressBase, double progressSpan)
{
  const bool separate = hasSeparateSource(r);
  const std::int64_t particles = separate ? r.source.count : r.points.count;
  const std::int64_t queries = queryCount(r);
  Request once = r;
  if (r.progress && (progressBase != 0.0 || progressSpan != 1.0))
  {
    once.progress = [&r, progressBase, progressSpan](double fraction, const char* stage) {
      return r.progress(progressBase + progressSpan * fraction, stage);
    };
  }
  if (particles <= pointsPerRun() && queries <= pointsPerRun())
  {
    try
    {
      return backend.runOnce(once);
    }
    catch (const DoesNotFit&)
    {
      // Checked before any output was written: cut it into slabs.
    }
  }
  else if (backend.runResident && !separate)
  {
    Report report;
    if (backend.runResident(once, report))
    {
      return report;
    }
  }
  return runPieces(r, backend, progressBase, progressSpan);
}

} // namespace detail
} // namespace neighborgrid
