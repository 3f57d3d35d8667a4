#include "NeighborhoodDistributed.h"

#include <vtkDataSetAttributes.h>
#include <vtkMultiProcessController.h>
#include <vtkSMPTools.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <memory>
#include <numeric>
#include <utility>
#include <vector>

#include <unistd.h> // gethostname

namespace neighborgrid_filters
{
namespace
{
using neighborgrid::Error;
using neighborgrid::Normalization;
using neighborgrid::Operation;
using neighborgrid::Points;
using neighborgrid::Report;
using neighborgrid::Request;

constexpr int messageBytes = 512;
constexpr int hostBytes = 256;
constexpr int exchangeTag = 7319400; // message tags of this file: exchangeTag and exchangeTag + 1

int RankCount(vtkMultiProcessController* controller)
{
  return controller ? std::max(1, controller->GetNumberOfProcesses()) : 1;
}

std::string MessageOf(const std::exception_ptr& failure)
{
  try
  {
    std::rethrow_exception(failure);
  }
  catch (const std::exception& e)
  {
    return e.what();
  }
  catch (...)
  {
    return "an unknown failure";
  }
}

/// Collective: every rank says whether it failed. Rethrows this rank's own failure; throws an
/// Error naming the first rank that failed when another did; returns when all succeeded.
void AgreeAllSucceeded(vtkMultiProcessController* controller, const std::exception_ptr& failure)
{
  const int ranks = RankCount(controller);
  if (ranks > 1)
  {
    std::vector<char> mine(messageBytes, 0), all(static_cast<std::size_t>(messageBytes) * ranks, 0);
    if (failure)
    {
      const std::string text = MessageOf(failure);
      std::strncpy(mine.data(), text.empty() ? "failed" : text.c_str(), messageBytes - 1);
    }
    controller->AllGather(mine.data(), all.data(), messageBytes);
    if (!failure)
    {
      for (int k = 0; k < ranks; ++k)
      {
        const char* text = all.data() + static_cast<std::size_t>(messageBytes) * k;
        if (text[0] != '\0')
        {
          throw Error("NeighborGrid: rank " + std::to_string(k) + " of " + std::to_string(ranks) +
            " failed, so no rank has results: " + std::string(text, strnlen(text, messageBytes)));
        }
      }
    }
  }
  if (failure)
  {
    std::rethrow_exception(failure);
  }
}

/// The axis-aligned box a rank needs particles around: its particles and its query points.
struct Region
{
  double lo[3] = { HUGE_VAL, HUGE_VAL, HUGE_VAL };
  double hi[3] = { -HUGE_VAL, -HUGE_VAL, -HUGE_VAL };
  bool empty() const { return !(lo[0] <= hi[0] && lo[1] <= hi[1] && lo[2] <= hi[2]); }
  void add(const double x[3])
  {
    for (int a = 0; a < 3; ++a)
    {
      lo[a] = std::min(lo[a], x[a]);
      hi[a] = std::max(hi[a], x[a]);
    }
  }
};

/// Whether x, or one of its periodic images, lies within the reach of the region on every axis:
/// a superset of "within `radius` of some point of the region" (the engine decides pairs exactly).
/// `radius`: R, or with per-particle radii the largest radius of any rank.
bool Reaches(const Request& r, double radius, const double x[3], const Region& g)
{
  if (g.empty())
  {
    return false;
  }
  for (int a = 0; a < 3; ++a)
  {
    const double reach = radius * (1.0 + 1e-9) + 1e-9 * (std::fabs(g.lo[a]) + std::fabs(g.hi[a]));
    if (!r.periodic[a])
    {
      if (!(x[a] >= g.lo[a] - reach && x[a] <= g.hi[a] + reach))
      {
        return false;
      }
      continue;
    }
    const double L = r.boxLengths[a];
    const double first = std::ceil((g.lo[a] - reach - x[a]) / L);
    const double last = std::floor((g.hi[a] + reach - x[a]) / L);
    if (!(first <= last))
    {
      return false;
    }
  }
  return true;
}

/// body(begin, end) over [0, n) on every core with vtkSMPTools. Debian's VTK defaults to its
/// Sequential backend, under which this per-point work would run on one thread while the engine
/// uses every core; then it runs in a local STDThread scope.
template <class Body>
void ParallelFor(std::int64_t n, const Body& body)
{
  if (n <= 0)
  {
    return;
  }
  auto run = [&] {
    vtkSMPTools::For(0, static_cast<vtkIdType>(n), vtkIdType(1) << 14,
      [&](vtkIdType begin, vtkIdType end) { body(std::int64_t(begin), std::int64_t(end)); });
  };
  if (std::strcmp(vtkSMPTools::GetBackend(), "Sequential") == 0)
  {
    vtkSMPTools::LocalScope(vtkSMPTools::Config{ std::string("STDThread") }, run);
  }
  else
  {
    run();
  }
}

/// The indices i in [0, n) with keep(i), in increasing order, found in parallel (a count per
/// block, a prefix sum, then each block writes its own range).
template <class Keep>
std::vector<std::int64_t> SelectIndices(std::int64_t n, const Keep& keep)
{
  constexpr std::int64_t blockSize = 1 << 16;
  const std::int64_t blocks = (n + blockSize - 1) / blockSize;
  std::vector<std::int64_t> offsets(static_cast<std::size_t>(blocks + 1), 0);
  ParallelFor(blocks, [&](std::int64_t first, std::int64_t last) {
    for (std::int64_t b = first; b < last; ++b)
    {
      std::int64_t kept = 0;
      for (std::int64_t i = b * blockSize, end = std::min(n, i + blockSize); i < end; ++i)
      {
        kept += keep(i) ? 1 : 0;
      }
      offsets[static_cast<std::size_t>(b + 1)] = kept;
    }
  });
  std::partial_sum(offsets.begin(), offsets.end(), offsets.begin());
  std::vector<std::int64_t> selected(static_cast<std::size_t>(offsets.back()));
  ParallelFor(blocks, [&](std::int64_t first, std::int64_t last) {
    for (std::int64_t b = first; b < last; ++b)
    {
      std::int64_t next = offsets[static_cast<std::size_t>(b)];
      for (std::int64_t i = b * blockSize, end = std::min(n, i + blockSize); i < end; ++i)
      {
        if (keep(i))
        {
          selected[static_cast<std::size_t>(next++)] = i;
        }
      }
    }
  });
  return selected;
}

/// reduce(accumulator, begin, end) over blocks of [0, n) in parallel, one accumulator per block
/// (they do not depend on the SMP backend, as vtkSMPThreadLocal does), combined in block order.
template <class T, class Reduce, class Combine>
T ReduceInBlocks(std::int64_t n, const T& initial, const Reduce& reduce, const Combine& combine)
{
  constexpr std::int64_t blockSize = 1 << 16;
  const std::int64_t blocks = (n + blockSize - 1) / blockSize;
  std::vector<T> partial(static_cast<std::size_t>(blocks), initial);
  ParallelFor(blocks, [&](std::int64_t first, std::int64_t last) {
    for (std::int64_t b = first; b < last; ++b)
    {
      reduce(partial[static_cast<std::size_t>(b)], b * blockSize, std::min(n, (b + 1) * blockSize));
    }
  });
  T total = initial;
  for (const T& p : partial)
  {
    combine(total, p);
  }
  return total;
}

/// Point i of p in double, read in the input's own precision (no converted copy of the array).
void ReadPoint(const Points& p, std::int64_t i, double x[3])
{
  for (int a = 0; a < 3; ++a)
  {
    x[a] = p.type == neighborgrid::ScalarType::Float64 ? static_cast<const double*>(p.xyz)[3 * i + a]
                                                       : double(static_cast<const float*>(p.xyz)[3 * i + a]);
  }
}

bool IsDuplicatePoint(const unsigned char* ghostFlags, std::int64_t i)
{
  return ghostFlags && (ghostFlags[i] & vtkDataSetAttributes::DUPLICATEPOINT);
}

/// Whether any point is flagged a ghost point (a parallel scan; false without flags).
bool AnyGhostPoint(const unsigned char* ghostFlags, std::int64_t n)
{
  if (!ghostFlags)
  {
    return false;
  }
  std::atomic<bool> found{ false };
  ParallelFor(n, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end && !found.load(std::memory_order_relaxed); ++i)
    {
      if (IsDuplicatePoint(ghostFlags, i))
      {
        found = true;
      }
    }
  });
  return found;
}

/// Which of this rank's particles it owns (all but the ghost points' copies of other ranks' points).
struct Ownership
{
  std::int64_t count = 0;          // owned particles
  std::vector<std::int64_t> list;  // their indices where some particles are ghosts; else 0..count-1
  std::vector<std::int64_t> ghosts; // the ghost points' indices
  std::int64_t operator[](std::int64_t k) const { return list.empty() ? k : list[static_cast<std::size_t>(k)]; }
};

Ownership OwnershipOf(const unsigned char* ghostFlags, std::int64_t n)
{
  Ownership o;
  if (ghostFlags)
  {
    o.ghosts = SelectIndices(n, [&](std::int64_t i) { return IsDuplicatePoint(ghostFlags, i); });
  }
  o.count = n - static_cast<std::int64_t>(o.ghosts.size());
  if (!o.ghosts.empty())
  {
    o.list = SelectIndices(n, [&](std::int64_t i) { return !IsDuplicatePoint(ghostFlags, i); });
  }
  return o;
}

/// The bounding box of the points, found in parallel.
void AddPoints(Region& g, const Points& p)
{
  const Region bounds = ReduceInBlocks(
    p.count, Region(),
    [&](Region& part, std::int64_t begin, std::int64_t end) {
      double x[3];
      for (std::int64_t i = begin; i < end; ++i)
      {
        ReadPoint(p, i, x);
        part.add(x);
      }
    },
    [](Region& total, const Region& part) {
      if (!part.empty())
      {
        total.add(part.lo);
        total.add(part.hi);
      }
    });
  if (!bounds.empty())
  {
    g.add(bounds.lo);
    g.add(bounds.hi);
  }
}

void AddGrid(Region& g, const neighborgrid::QueryGrid& grid)
{
  double a[3], b[3];
  for (int axis = 0; axis < 3; ++axis)
  {
    a[axis] = grid.origin[axis];
    b[axis] = grid.origin[axis] + double(grid.dimensions[axis] - 1) * grid.spacing[axis];
  }
  g.add(a);
  g.add(b);
}

/// Sends sendTo[k] to every rank k and returns what every rank sent here (empty from itself).
/// Pairwise in P steps: in step s rank r pairs with (s - r) mod P, so every pair meets once and
/// each rank has one partner per step; in each pair the lower rank sends first, so the blocking
/// sends of MPI never wait on each other.
template <class T>
std::vector<std::vector<T>> ExchangeWithEveryRank(vtkMultiProcessController* controller,
  const std::vector<std::vector<T>>& sendTo)
{
  const int ranks = RankCount(controller);
  const int rank = controller->GetLocalProcessId();
  std::vector<std::vector<T>> received(static_cast<std::size_t>(ranks));
  for (int step = 0; step < ranks; ++step)
  {
    const int partner = ((step - rank) % ranks + ranks) % ranks;
    if (partner == rank)
    {
      continue;
    }
    auto send = [&] {
      const std::vector<T>& data = sendTo[static_cast<std::size_t>(partner)];
      long long size = static_cast<long long>(data.size());
      if (!controller->Send(&size, 1, partner, exchangeTag) ||
        (size > 0 && !controller->Send(data.data(), static_cast<vtkIdType>(size), partner, exchangeTag + 1)))
      {
        throw Error("NeighborGrid: sending halo data to rank " + std::to_string(partner) + " failed");
      }
    };
    auto receive = [&] {
      long long size = 0;
      std::vector<T>& data = received[static_cast<std::size_t>(partner)];
      if (!controller->Receive(&size, 1, partner, exchangeTag))
      {
        throw Error("NeighborGrid: receiving halo data from rank " + std::to_string(partner) + " failed");
      }
      data.resize(static_cast<std::size_t>(size));
      if (size > 0 && !controller->Receive(data.data(), static_cast<vtkIdType>(size), partner, exchangeTag + 1))
      {
        throw Error("NeighborGrid: receiving halo data from rank " + std::to_string(partner) + " failed");
      }
    };
    if (rank < partner)
    {
      send();
      receive();
    }
    else
    {
      receive();
      send();
    }
  }
  return received;
}

/// std::vector that leaves new elements uninitialized: per-point buffers are written in parallel
/// right after, and a zero fill first would be one more pass over them on one thread.
template <class T>
struct UninitializedAllocator : std::allocator<T>
{
  template <class U>
  struct rebind
  {
    using other = UninitializedAllocator<U>;
  };
  UninitializedAllocator() = default;
  template <class U>
  UninitializedAllocator(const UninitializedAllocator<U>&) noexcept
  {
  }
  template <class U>
  void construct(U* p) noexcept
  {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args)
  {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};
template <class T>
using HostVector = std::vector<T, UninitializedAllocator<T>>;

/// Per rank k, `components` values value(i, c) per particle i of sendIndices[k], in parallel.
template <class T, class Value>
std::vector<std::vector<T>> Gathered(
  int components, const std::vector<std::vector<std::int64_t>>& sendIndices, const Value& value)
{
  std::vector<std::vector<T>> out(sendIndices.size());
  for (std::size_t k = 0; k < sendIndices.size(); ++k)
  {
    const std::vector<std::int64_t>& indices = sendIndices[k];
    out[k].resize(indices.size() * static_cast<std::size_t>(components));
    T* to = out[k].data();
    ParallelFor(static_cast<std::int64_t>(indices.size()), [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t m = begin; m < end; ++m)
      {
        for (int c = 0; c < components; ++c)
        {
          to[m * components + c] = value(indices[static_cast<std::size_t>(m)], c);
        }
      }
    });
  }
  return out;
}

template <class T>
std::vector<std::vector<T>> Gathered(const T* values, int components,
  const std::vector<std::vector<std::int64_t>>& sendIndices)
{
  return Gathered<T>(components, sendIndices, [&](std::int64_t i, int c) { return values[i * components + c]; });
}

/// This rank's owned values (value(i, c) for its owned particles i) followed by what every rank
/// sent, in rank order: the layout of the extended particle set.
template <class T, class Value>
HostVector<T> Extended(
  int components, const Ownership& owned, const std::vector<std::vector<T>>& received, const Value& value)
{
  std::size_t total = static_cast<std::size_t>(owned.count) * static_cast<std::size_t>(components);
  for (const auto& r : received)
  {
    total += r.size();
  }
  HostVector<T> out(total);
  ParallelFor(owned.count, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t k = begin; k < end; ++k)
    {
      for (int c = 0; c < components; ++c)
      {
        out[static_cast<std::size_t>(k * components + c)] = value(owned[k], c);
      }
    }
  });
  std::size_t next = static_cast<std::size_t>(owned.count) * static_cast<std::size_t>(components);
  for (const auto& r : received)
  {
    std::copy(r.begin(), r.end(), out.begin() + static_cast<std::ptrdiff_t>(next));
    next += r.size();
  }
  return out;
}

template <class T>
HostVector<T> Extended(
  const T* values, int components, const Ownership& owned, const std::vector<std::vector<T>>& received)
{
  return Extended<T>(components, owned, received, [&](std::int64_t i, int c) { return values[i * components + c]; });
}

/// Coordinate c of point i of p in double: a value function for Gathered and Extended.
auto CoordinateOf(const Points& p)
{
  return [&p](std::int64_t i, int c) {
    return p.type == neighborgrid::ScalarType::Float64 ? static_cast<const double*>(p.xyz)[3 * i + c]
                                                       : double(static_cast<const float*>(p.xyz)[3 * i + c]);
  };
}

double MillisecondsSince(std::chrono::steady_clock::time_point began)
{
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - began).count();
}

int NodeLocalDevice(vtkMultiProcessController* controller)
{
  const int ranks = RankCount(controller);
  const int rank = controller->GetLocalProcessId();
  std::vector<char> host(hostBytes, 0), all(static_cast<std::size_t>(hostBytes) * ranks, 0);
  gethostname(host.data(), hostBytes - 1);
  controller->AllGather(host.data(), all.data(), hostBytes);
  int localRank = 0;
  for (int k = 0; k < rank; ++k)
  {
    localRank += std::strncmp(all.data() + static_cast<std::size_t>(hostBytes) * k, host.data(), hostBytes) == 0;
  }
  const int devices = neighborgrid::Engine::cudaDeviceCount();
  return devices > 0 ? localRank % devices : -1;
}

void AppendStages(Report& into, const Report& from, const std::string& prefix)
{
  for (const neighborgrid::StageTime& t : from.stages)
  {
    into.stages.push_back({ prefix + t.stage, t.milliseconds });
  }
  into.pairsDecidedInDouble += from.pairsDecidedInDouble;
}

/// What the ranks agree on before the exchange: every rank's region, whether masses and radii
/// travel (a rank without points may have neither, so no rank decides that from its own data),
/// and the largest radius of any rank (the halo's width with radii).
struct RankAgreement
{
  std::vector<Region> regions;
  bool sendMass = false;
  bool sendRadii = false;
  double largestRadius = 0.0;
};

/// Collective.
RankAgreement AgreeOnRegions(vtkMultiProcessController* controller, const Region& region, bool sendMass,
  bool sendRadii, double largestRadius)
{
  const int ranks = RankCount(controller);
  constexpr int entries = 9; // region (6), sends masses, sends radii, largest radius
  std::vector<double> mine(entries), all(entries * static_cast<std::size_t>(ranks));
  for (int a = 0; a < 3; ++a)
  {
    mine[a] = region.lo[a];
    mine[3 + a] = region.hi[a];
  }
  mine[6] = sendMass ? 1.0 : 0.0;
  mine[7] = sendRadii ? 1.0 : 0.0;
  mine[8] = largestRadius;
  controller->AllGather(mine.data(), all.data(), entries);
  RankAgreement agreed;
  agreed.regions.resize(static_cast<std::size_t>(ranks));
  for (int k = 0; k < ranks; ++k)
  {
    for (int a = 0; a < 3; ++a)
    {
      agreed.regions[k].lo[a] = all[entries * k + a];
      agreed.regions[k].hi[a] = all[entries * k + 3 + a];
    }
    agreed.sendMass = agreed.sendMass || all[entries * k + 6] != 0.0;
    agreed.sendRadii = agreed.sendRadii || all[entries * k + 7] != 0.0;
    agreed.largestRadius = std::max(agreed.largestRadius, all[entries * k + 8]);
  }
  return agreed;
}

/// The halo every other rank needs: per rank k, the indices of this rank's owned particles within
/// `reach` of k's region (periodic images included), chosen in parallel. The larger part of the
/// prologue: a test per owned particle and rank.
std::vector<std::vector<std::int64_t>> ChooseHalo(const Request& request, const Points& particles,
  const Ownership& owned, const std::vector<Region>& regions, int rank, double reach)
{
  std::vector<std::vector<std::int64_t>> sendIndices(regions.size());
  for (int k = 0; k < static_cast<int>(regions.size()); ++k)
  {
    if (k == rank)
    {
      continue;
    }
    std::vector<std::int64_t> chosen = SelectIndices(owned.count, [&](std::int64_t m) {
      double x[3];
      ReadPoint(particles, owned[m], x);
      return Reaches(request, reach, x, regions[k]);
    });
    if (!owned.list.empty())
    {
      ParallelFor(static_cast<std::int64_t>(chosen.size()), [&](std::int64_t begin, std::int64_t end) {
        for (std::int64_t m = begin; m < end; ++m)
        {
          chosen[static_cast<std::size_t>(m)] = owned[chosen[static_cast<std::size_t>(m)]];
        }
      });
    }
    sendIndices[k] = std::move(chosen);
  }
  return sendIndices;
}

/// What this rank receives from every other: positions (double), masses, radii and the arrays to
/// smooth of their particles within reach of this rank's region, per rank.
struct Halo
{
  std::vector<std::vector<double>> xyz;
  std::vector<std::vector<float>> mass, radii;
  std::vector<std::vector<std::vector<float>>> values; // per array to smooth, per rank

  Halo(int ranks, std::size_t arrays)
    : xyz(static_cast<std::size_t>(ranks)), mass(static_cast<std::size_t>(ranks)),
      radii(static_cast<std::size_t>(ranks)), values(arrays)
  {
  }

  /// Collective: sends every rank k the particles sendIndices[k] (masses and radii where the ranks
  /// agreed they travel: every rank must take part, one without points too) and receives theirs.
  void Exchange(vtkMultiProcessController* controller, const std::vector<std::vector<std::int64_t>>& sendIndices,
    const Request& request, const Points& particles, bool sendMass, const float* masses, bool sendRadii)
  {
    xyz = ExchangeWithEveryRank(controller, Gathered<double>(3, sendIndices, CoordinateOf(particles)));
    if (sendMass)
    {
      mass = ExchangeWithEveryRank(controller, Gathered(masses, 1, sendIndices));
    }
    if (sendRadii)
    {
      radii = ExchangeWithEveryRank(controller, Gathered(request.radii, 1, sendIndices));
    }
    for (std::size_t a = 0; a < request.smoothed.size(); ++a)
    {
      values[a] = ExchangeWithEveryRank(
        controller, Gathered(request.smoothed[a].values, request.smoothed[a].components, sendIndices));
    }
  }

  std::int64_t Count() const
  {
    std::int64_t count = 0;
    for (const auto& h : xyz)
    {
      count += static_cast<std::int64_t>(h.size() / 3);
    }
    return count;
  }
};

/// The particles a rank runs on: its owned particles, then the halo in rank order, with their
/// masses, radii and arrays to smooth where those travel.
struct ExtendedSet
{
  HostVector<double> xyz;
  HostVector<float> mass, radii; // empty where they do not travel
  std::vector<HostVector<float>> values;

  std::int64_t count() const { return static_cast<std::int64_t>(xyz.size() / 3); }

  static ExtendedSet Of(const Request& request, const Points& particles, const Ownership& owned, const float* masses,
    const std::vector<std::vector<double>>& haloXyz, const std::vector<std::vector<float>>* haloMass,
    const std::vector<std::vector<float>>* haloRadii, const std::vector<std::vector<std::vector<float>>>& haloValues)
  {
    ExtendedSet set;
    set.xyz = Extended<double>(3, owned, haloXyz, CoordinateOf(particles));
    if (haloMass)
    {
      set.mass = Extended(masses, 1, owned, *haloMass);
    }
    if (haloRadii)
    {
      set.radii = Extended(request.radii, 1, owned, *haloRadii);
    }
    for (std::size_t a = 0; a < request.smoothed.size(); ++a)
    {
      set.values.push_back(Extended(request.smoothed[a].values, request.smoothed[a].components, owned, haloValues[a]));
    }
    return set;
  }

  /// `request` on this set: its particles (or sources, `separate`), masses, radii and values.
  Request RequestFor(const Request& request, bool separate) const
  {
    Request run = request;
    run.mass = mass.empty() ? nullptr : mass.data();
    run.radii = radii.empty() ? nullptr : radii.data();
    for (std::size_t a = 0; a < run.smoothed.size(); ++a)
    {
      run.smoothed[a].values = values[a].data();
    }
    (separate ? run.source : run.points) = Points(xyz.data(), count());
    return run;
  }
};

/// SPH smoothing and the gradient weigh every particle by its volume m_j / rho_j: rho at every
/// particle of the extended set (exact at this rank's own, whose halo is complete), then rho of
/// the halo points from their owners (here they miss the neighbors beyond this rank's region),
/// and the volumes. Collective.
void HaloDensities(neighborgrid::Engine& engine, vtkMultiProcessController* controller, const Request& request,
  const Request& run, const ExtendedSet& ext, const Ownership& owned,
  const std::vector<std::vector<std::int64_t>>& sendIndices, std::int64_t n, HostVector<float>& rho,
  HostVector<float>& volumes, Report& report, std::exception_ptr& failure)
{
  const std::int64_t extCount = ext.count();
  try
  {
    Request density = run;
    density.points = Points(ext.xyz.data(), extCount);
    density.source = Points();
    density.queryGrid = neighborgrid::QueryGrid();
    density.valid = nullptr;
    density.operation = Operation::Density;
    density.smoothed.clear();
    density.neighborCount = nullptr;
    rho.resize(static_cast<std::size_t>(extCount));
    density.density = rho.data();
    if (extCount > 0)
    {
      AppendStages(report, engine.run(density), "density: ");
    }
  }
  catch (...)
  {
    failure = std::current_exception();
  }
  AgreeAllSucceeded(controller, failure);
  if (RankCount(controller) > 1)
  {
    std::vector<float> ownRho(static_cast<std::size_t>(n), 0.0f);
    ParallelFor(owned.count, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t k = begin; k < end; ++k)
      {
        ownRho[static_cast<std::size_t>(owned[k])] = rho[static_cast<std::size_t>(k)];
      }
    });
    const auto haloRho = ExchangeWithEveryRank(controller, Gathered(ownRho.data(), 1, sendIndices));
    std::size_t next = static_cast<std::size_t>(owned.count);
    for (const auto& h : haloRho)
    {
      std::copy(h.begin(), h.end(), rho.begin() + static_cast<std::ptrdiff_t>(next));
      next += h.size();
    }
  }
  volumes.resize(static_cast<std::size_t>(extCount));
  const bool masses = !ext.mass.empty();
  ParallelFor(extCount, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t j = begin; j < end; ++j)
    {
      volumes[j] = (masses ? ext.mass[j] : static_cast<float>(request.constantMass)) / rho[j];
    }
  });
}

/// This rank's particles take their results, in input order, from the first owned.count entries
/// of the extended set's.
void WriteOwnedResults(const Request& request, const Ownership& owned, const HostVector<std::int32_t>& counts,
  const float* density, const std::vector<HostVector<float>>& outputs, int outputsPerComponent)
{
  ParallelFor(owned.count, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t k = begin; k < end; ++k)
    {
      const std::size_t from = static_cast<std::size_t>(k);
      const std::int64_t to = owned[k];
      if (request.neighborCount)
      {
        request.neighborCount[to] = counts[from];
      }
      if (request.density)
      {
        request.density[to] = density[from];
      }
      for (std::size_t a = 0; a < request.smoothed.size(); ++a)
      {
        const int c = request.smoothed[a].components * outputsPerComponent;
        std::copy_n(outputs[a].begin() + k * c, c, request.smoothed[a].output + to * c);
      }
    }
  });
}

/// Queries with no particle anywhere near (this rank received none): what the engine writes for
/// a query without neighbors.
void FillWithoutNeighbors(const Request& r)
{
  const std::int64_t m = r.queryGrid.empty() ? r.points.count : r.queryGrid.count();
  if (r.neighborCount)
  {
    std::fill_n(r.neighborCount, m, 0);
  }
  if (r.density)
  {
    std::fill_n(r.density, m, 0.0f);
  }
  for (const neighborgrid::SmoothedArray& a : r.smoothed)
  {
    std::fill_n(a.output, m * a.components, r.nullValue);
  }
  if (r.valid)
  {
    std::fill_n(r.valid, m, std::uint8_t(0));
  }
}

/// Ghost points (copies of other ranks' points): a query at their position over the extended
/// particle set, which is their owner's result less the owner's copy at distance 0.
void AnswerGhostPoints(neighborgrid::Engine& engine, const Request& request, const Request& run,
  const Points& particles, const std::vector<std::int64_t>& ghosts, const double* extXyz, std::int64_t extCount,
  const float* extMass, bool sph, Report& report)
{
  if (extCount == 0)
  {
    throw Error("NeighborGrid: point " + std::to_string(ghosts[0]) +
      " is a ghost point (vtkGhostType DUPLICATEPOINT), but no rank owns a point at its position");
  }
  const std::int64_t g = static_cast<std::int64_t>(ghosts.size());
  const std::vector<std::vector<std::int64_t>> ghostList{ ghosts };
  const std::vector<double> ghostXyz = Gathered<double>(3, ghostList, CoordinateOf(particles))[0];
  Request query = run;
  query.source = Points(extXyz, extCount);
  query.points = Points(ghostXyz.data(), g);
  std::vector<std::int32_t> counts(static_cast<std::size_t>(request.neighborCount ? g : 0));
  std::vector<float> density(static_cast<std::size_t>(request.density ? g : 0));
  std::vector<std::vector<float>> outputs;
  query.neighborCount = request.neighborCount ? counts.data() : nullptr;
  query.density = request.density && !sph ? density.data() : nullptr;
  for (auto& array : query.smoothed)
  {
    outputs.emplace_back(static_cast<std::size_t>(g * array.components));
    array.output = outputs.back().data();
  }
  AppendStages(report, engine.run(query), "ghost points: ");
  if (sph && request.density)
  {
    Request queryDensity = query;
    queryDensity.operation = Operation::Density;
    queryDensity.smoothed.clear();
    queryDensity.particleVolumes = nullptr;
    queryDensity.mass = extMass;
    queryDensity.density = density.data();
    AppendStages(report, engine.run(queryDensity), "ghost points density: ");
  }
  if (request.neighborCount)
  {
    // The owner's copy lies at distance 0: a point is not its own neighbor.
    const auto orphan = std::find_if(counts.begin(), counts.end(), [](std::int32_t c) { return c < 1; });
    if (orphan != counts.end())
    {
      throw Error("NeighborGrid: point " + std::to_string(ghosts[static_cast<std::size_t>(orphan - counts.begin())]) +
        " is a ghost point (vtkGhostType DUPLICATEPOINT), but no rank owns a point at its position");
    }
  }
  ParallelFor(g, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t k = begin; k < end; ++k)
    {
      const std::int64_t to = ghosts[static_cast<std::size_t>(k)];
      if (request.neighborCount)
      {
        request.neighborCount[to] = counts[k] - 1;
      }
      if (request.density)
      {
        request.density[to] = density[k];
      }
      for (std::size_t a = 0; a < request.smoothed.size(); ++a)
      {
        const int c = request.smoothed[a].components;
        std::copy_n(outputs[a].begin() + k * c, c, request.smoothed[a].output + to * c);
      }
    }
  });
}

} // namespace

void ReportFailureToOtherRanks(vtkMultiProcessController* controller, const std::string& message)
{
  if (RankCount(controller) <= 1)
  {
    return;
  }
  try
  {
    AgreeAllSucceeded(controller, std::make_exception_ptr(Error(message)));
  }
  catch (const Error&)
  {
    // Our own failure, known to the caller already.
  }
}

Report RunDistributed(neighborgrid::Engine& engine, const Request& request, bool queriesAreParticles,
  const unsigned char* ghostFlags, vtkMultiProcessController* controller, DistributedSummary& summary)
{
  const int ranks = RankCount(controller);
  summary = DistributedSummary();
  summary.ranks = ranks;
  summary.rank = ranks > 1 ? controller->GetLocalProcessId() : 0;
  const bool separate = !queriesAreParticles;
  const std::int64_t queryCount =
    !separate ? 0 : (request.queryGrid.empty() ? request.points.count : request.queryGrid.count());
  const Points& particles = separate ? request.source : request.points;
  const std::int64_t n = particles.count;

  // The path of almost every run: one process and no ghost points. Nothing to exchange and
  // nothing to leave out, so the caller's arrays go to the engine as they are: no pass over the
  // points here (a ghost array, where there is one, is only scanned for ghost points).
  const auto prologueBegan = std::chrono::steady_clock::now();
  if (ranks == 1 && !AnyGhostPoint(ghostFlags, n))
  {
    return engine.run(request);
  }

  // --- This rank: which particles it owns, and its region (in parallel, in the input's precision)
  Ownership owned;
  Region region;
  std::exception_ptr failure;
  try
  {
    owned = OwnershipOf(ghostFlags, n);
    AddPoints(region, particles);
    // Ghost points among the particles are answered by a query at their position over the
    // particles, which takes neither a gradient (grad f_i needs f_i) nor a radius of its own
    // (Gather, Symmetric). (With separate queries they are only left out of the particles.)
    const bool radiiOrGradient = request.radii || request.operation == Operation::Gradient;
    if (radiiOrGradient && !owned.ghosts.empty() && !separate)
    {
      throw Error("NeighborGrid: point " + std::to_string(owned.ghosts[0]) +
        " is a ghost point (vtkGhostType DUPLICATEPOINT); " +
        (request.radii ? "a radius array (per-particle radii)" : "the Gradient operation") +
        " is not supported with ghost points yet: remove them first (Remove Ghost Information)");
    }
    if (separate && queryCount > 0)
    {
      if (request.queryGrid.empty())
      {
        AddPoints(region, request.points);
      }
      else
      {
        AddGrid(region, request.queryGrid);
      }
    }
  }
  catch (...)
  {
    failure = std::current_exception();
  }
  summary.ghostPoints = separate ? 0 : static_cast<std::int64_t>(owned.ghosts.size());
  const std::vector<std::int64_t>& ghosts = owned.ghosts;
  summary.prologueMilliseconds = MillisecondsSince(prologueBegan); // this rank's own work only
  AgreeAllSucceeded(controller, failure);

  std::vector<Region> regions(static_cast<std::size_t>(ranks));
  regions[static_cast<std::size_t>(summary.rank)] = region;
  std::vector<std::vector<std::int64_t>> sendIndices(static_cast<std::size_t>(ranks));
  Halo halo(ranks, request.smoothed.size());
  // SPH smoothing and the gradient weigh every particle by its volume m_j / rho_j: rho of a halo
  // point comes from its owner (here it would miss the neighbors beyond this rank's region).
  const bool gradient = request.operation == Operation::Gradient;
  const bool sph = gradient || (request.operation == Operation::Smoothing && request.normalization == Normalization::SPH);
  const int outputsPerComponent = gradient ? 3 : 1;
  // Per-particle radii: they travel with the halo, whose width is the largest radius of any rank.
  // Whether radii are used must not depend on this rank's data (a rank without points has none):
  // the ranks agree below.
  bool sendRadii = request.radii != nullptr;
  double reach = request.radius;
  if (request.radii)
  {
    const auto radiiBegan = std::chrono::steady_clock::now();
    reach = ReduceInBlocks(
      n, 0.0,
      [&](double& largest, std::int64_t begin, std::int64_t end) {
        for (std::int64_t i = begin; i < end; ++i)
        {
          largest = std::max(largest, static_cast<double>(request.radii[i]));
        }
      },
      [](double& total, double part) { total = std::max(total, part); });
    summary.prologueMilliseconds += MillisecondsSince(radiiBegan);
  }
  // Whether masses travel must not depend on this rank's data (a rank without points may hold no
  // mass array): the ranks agree below; a rank without a mass array sends its constant mass.
  bool sendMass = request.mass && (request.operation == Operation::Density || sph);
  HostVector<float> constantMasses;
  const float* masses = request.mass;
  const auto exchangeBegan = std::chrono::steady_clock::now();
  double haloChoiceMilliseconds = 0.0; // part of the prologue, not of the exchange
  if (ranks > 1)
  {
    // Which device: the rank's place among the ranks on its host.
    summary.cudaDevice = NodeLocalDevice(controller);
    if (summary.cudaDevice >= 0 && request.backend != neighborgrid::Backend::CPU)
    {
      engine.setCudaDevice(summary.cudaDevice);
    }
    // Every rank's region, and whether masses and radii travel (an empty region reaches nothing).
    const RankAgreement agreed = AgreeOnRegions(controller, region, sendMass, sendRadii, request.radii ? reach : 0.0);
    regions = agreed.regions;
    sendMass = agreed.sendMass;
    sendRadii = agreed.sendRadii;
    if (sendRadii)
    {
      reach = agreed.largestRadius;
    }
    if (sendMass && !masses)
    {
      constantMasses.resize(static_cast<std::size_t>(n));
      ParallelFor(n, [&](std::int64_t begin, std::int64_t end) {
        std::fill(constantMasses.begin() + begin, constantMasses.begin() + end, static_cast<float>(request.constantMass));
      });
      masses = constantMasses.data();
    }
    // Other ranks use radii; so must this one, for its points (a rank with points and no radii
    // would otherwise search with Radius; it cannot happen through the filters).
    std::exception_ptr radiiFailure;
    if (sendRadii && !request.radii && n > 0)
    {
      radiiFailure = std::make_exception_ptr(Error("NeighborGrid: other ranks have per-particle radii, this one has none"));
    }
    AgreeAllSucceeded(controller, radiiFailure);
    const auto haloBegan = std::chrono::steady_clock::now();
    sendIndices = ChooseHalo(request, particles, owned, regions, summary.rank, reach);
    for (const auto& indices : sendIndices)
    {
      summary.haloSent += static_cast<std::int64_t>(indices.size());
    }
    haloChoiceMilliseconds = MillisecondsSince(haloBegan);
    summary.prologueMilliseconds += haloChoiceMilliseconds;
    halo.Exchange(controller, sendIndices, request, particles, sendMass, masses, sendRadii);
  }
  summary.haloReceived = halo.Count();
  summary.exchangeMilliseconds = MillisecondsSince(exchangeBegan) - haloChoiceMilliseconds;

  // --- The extended particle set: owned particles, then the halo in rank order --------------
  const auto extendedBegan = std::chrono::steady_clock::now();
  const ExtendedSet ext = ExtendedSet::Of(request, particles, owned, masses, halo.xyz, sendMass ? &halo.mass : nullptr,
    sendRadii ? &halo.radii : nullptr, halo.values);
  const HostVector<double>& extXyz = ext.xyz;
  const HostVector<float>& extMass = ext.mass;
  const std::int64_t extCount = ext.count();
  const std::int64_t ownedCount = owned.count;
  Request run = ext.RequestFor(request, separate);
  // Particle mode: outputs for the whole extended set; the first ownedCount are this rank's.
  HostVector<std::int32_t> extCounts;
  HostVector<float> extDensity;
  std::vector<HostVector<float>> extOutputs;
  if (!separate)
  {
    if (request.neighborCount)
    {
      extCounts.resize(static_cast<std::size_t>(extCount));
      run.neighborCount = extCounts.data();
    }
    if (request.density)
    {
      extDensity.resize(static_cast<std::size_t>(extCount));
      run.density = extDensity.data();
    }
    for (auto& array : run.smoothed)
    {
      extOutputs.emplace_back(static_cast<std::size_t>(extCount * array.components * outputsPerComponent));
      array.output = extOutputs.back().data();
    }
  }
  summary.prologueMilliseconds += MillisecondsSince(extendedBegan);

  Report report;
  HostVector<float> rho, volumes;
  if (sph)
  {
    HaloDensities(engine, controller, request, run, ext, owned, sendIndices, n, rho, volumes, report, failure);
    if (separate && request.density && extCount > 0 && queryCount > 0)
    {
      try
      {
        Request queryDensity = run;
        queryDensity.operation = Operation::Density;
        queryDensity.smoothed.clear();
        AppendStages(report, engine.run(queryDensity), "query density: ");
      }
      catch (...)
      {
        failure = std::current_exception();
      }
    }
    run.particleVolumes = volumes.data();
    run.mass = nullptr;
    run.density = nullptr;
  }

  Report last;
  try
  {
    if (!failure && separate && (extCount == 0 || queryCount == 0))
    {
      FillWithoutNeighbors(request); // no particle within reach on any rank
    }
    else if (!failure && separate)
    {
      last = engine.run(run);
    }
    else if (!failure)
    {
      if (extCount > 0)
      {
        last = engine.run(run);
      }
      WriteOwnedResults(request, owned, extCounts, sph ? rho.data() : extDensity.data(), extOutputs, outputsPerComponent);
      if (!ghosts.empty())
      {
        AnswerGhostPoints(engine, request, run, particles, ghosts, extXyz.data(), extCount,
          sendMass ? extMass.data() : nullptr, sph, report);
      }
    }
  }
  catch (...)
  {
    failure = std::current_exception();
  }
  AgreeAllSucceeded(controller, failure);

  Report merged = last;
  merged.stages.clear();
  merged.stages.push_back({ "distributed prologue", summary.prologueMilliseconds });
  merged.stages.push_back({ "halo exchange", summary.exchangeMilliseconds });
  AppendStages(merged, report, "");
  merged.pairsDecidedInDouble = report.pairsDecidedInDouble;
  AppendStages(merged, last, "");
  if (request.neighborCount && !separate)
  {
    // This rank's own points: the ranks' sums add up to the serial one.
    merged.neighborPairs = ReduceInBlocks(
      ownedCount, std::int64_t(0),
      [&](std::int64_t& pairs, std::int64_t begin, std::int64_t end) {
        for (std::int64_t k = begin; k < end; ++k)
        {
          pairs += request.neighborCount[owned[k]];
        }
      },
      [](std::int64_t& total, std::int64_t part) { total += part; });
  }
  return merged;
}

} // namespace neighborgrid_filters
