#include "NeighborhoodDistributed.h"

#include <vtkDataSetAttributes.h>
#include <vtkMultiProcessController.h>
#include <vtkCommunicator.h>
#include <vtkSMPTools.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <memory>
#include <numeric>
#include <type_traits>
#include <unordered_map>
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
  std::vector<double> reaches; // every rank's own `largestRadius` entry
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
  agreed.reaches.resize(static_cast<std::size_t>(ranks));
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
    agreed.reaches[k] = all[entries * k + 8];
  }
  return agreed;
}

/// The halo every other rank needs: per rank k, the indices of this rank's owned particles within
/// reaches[k] of k's region (periodic images included), chosen in parallel. The larger part of
/// the prologue: a test per owned particle and rank.
std::vector<std::vector<std::int64_t>> ChooseHalo(const Request& request, const Points& particles,
  const Ownership& owned, const std::vector<Region>& regions, int rank, const std::vector<double>& reaches)
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
      return Reaches(request, reaches[static_cast<std::size_t>(k)], x, regions[k]);
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

/// Results of particles, for copying to other points: the extended set's (owned particles first),
/// this rank's outputs (by particle index) or what the owners of its halo sent (by position in
/// that rank's halo).
struct ParticleResults
{
  const std::int32_t* counts = nullptr;
  const float* density = nullptr;
  const float* supportRadius = nullptr;
  std::vector<const float*> outputs; // per array: the request's output width per particle

  /// Particle i's results into point `to` of the request's outputs.
  void CopyTo(const Request& r, std::int64_t i, std::int64_t to, int outputsPerComponent) const
  {
    if (r.neighborCount)
    {
      r.neighborCount[to] = counts[i];
    }
    if (r.density)
    {
      r.density[to] = density[i];
    }
    if (r.supportRadius)
    {
      r.supportRadius[to] = supportRadius[i];
    }
    for (std::size_t a = 0; a < r.smoothed.size(); ++a)
    {
      const int c = r.smoothed[a].components * outputsPerComponent;
      std::copy_n(outputs[a] + i * c, c, r.smoothed[a].output + to * c);
    }
  }
};

/// This rank's particles take their results, in input order, from the first owned.count entries
/// of the extended set's.
void WriteOwnedResults(const Request& request, const Ownership& owned, const HostVector<std::int32_t>& counts,
  const float* density, const float* supportRadius, const std::vector<HostVector<float>>& outputs,
  int outputsPerComponent)
{
  ParticleResults extended;
  extended.counts = counts.data();
  extended.density = density;
  extended.supportRadius = supportRadius;
  for (const auto& output : outputs)
  {
    extended.outputs.push_back(output.data());
  }
  ParallelFor(owned.count, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t k = begin; k < end; ++k)
    {
      extended.CopyTo(request, k, owned[k], outputsPerComponent);
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

/// The results of the queries at the ghost points, in their order.
struct GhostAnswers
{
  std::vector<std::int32_t> counts;
  std::vector<float> density;
  std::vector<std::vector<float>> outputs; // per array to smooth
};

using Clock = std::chrono::steady_clock;

/// One run over the ranks, stage by stage; RunDistributed calls the stages in order. Every
/// stage that talks to the other ranks is collective: where one rank fails there, every rank
/// throws an Error that names it (AgreeAllSucceeded), so none waits for another.
class DistributedRun
{
public:
  DistributedRun(neighborgrid::Engine& engine, const Request& request, bool separate,
    vtkMultiProcessController* controller, DistributedSummary& summary);

  void FindOwnershipAndRegion(const unsigned char* ghostFlags, Clock::time_point prologueBegan);
  void ExchangeHalo();
  void BuildExtendedSet();
  void WeighByHaloDensities();
  void Compute();
  Report MergedReport() const;

private:
  void MeasureHaloWidth();
  void AgreeWithOtherRanks();
  void ExtendedDensities();
  void HaloDensitiesFromOwners();
  void AnswerGhostPoints();
  GhostAnswers QueryGhostPoints();
  double LocalSmoothingLengthReach();
  void AnswerGhostCopies();
  /// Whether ghost points take their particle's results (AnswerGhostCopies) because a query at
  /// their position cannot give them: Smoothing Length, per-particle radii, the gradient. From
  /// what the ranks agreed on (a rank without points has no radii array), so all take one path.
  bool GhostsCopyTheirParticle() const
  {
    return this->smoothingLength || this->sendRadii || this->request.operation == Operation::Gradient;
  }

  // The run as the filter asked for it.
  neighborgrid::Engine& engine;
  const Request& request;
  const bool separate; // results at separate queries (request.source holds the particles)
  vtkMultiProcessController* controller;
  DistributedSummary& summary;
  const Points& particles;
  const std::int64_t queryCount;
  // SPH smoothing and the gradient weigh every particle by its volume m_j / rho_j.
  const bool sph;
  const int outputsPerComponent; // the gradient: 3 per component
  // Smoothing Length: the halo reaches as far as the k-th neighbor of a rank's points on that rank
  // alone (more particles can only bring it nearer); every rank has its own reach.
  const bool smoothingLength;

  // What the stages hand on.
  std::exception_ptr failure;
  Ownership owned;
  Region region;
  double reach;        // the halo's width: R, the largest radius of any rank, or this rank's own
  std::vector<double> reaches; // per rank, how far its region reaches (the same for all but
                               // Smoothing Length)
  bool sendRadii;      // agreed by the ranks: a rank without points has no radii
  bool sendMass;       // agreed likewise; a rank without a mass array sends its constant mass
  const float* masses; // request.mass or constantMasses
  HostVector<float> constantMasses;
  std::vector<Region> regions; // every rank's
  std::vector<std::vector<std::int64_t>> sendIndices; // per rank, the owned particles it gets
  Halo halo;
  ExtendedSet ext;
  Request run; // the request on the extended set
  HostVector<std::int32_t> extCounts; // particle mode: outputs for the whole extended set
  HostVector<float> extDensity;
  HostVector<float> extSupport; // Smoothing Length: this rank's owned particles only
  std::vector<HostVector<float>> extOutputs;
  HostVector<float> rho, volumes;
  Report report; // the stages before the main run
  Report last;   // the main run
};

DistributedRun::DistributedRun(neighborgrid::Engine& engine, const Request& request, bool separate,
  vtkMultiProcessController* controller, DistributedSummary& summary)
  : engine(engine)
  , request(request)
  , separate(separate)
  , controller(controller)
  , summary(summary)
  , particles(separate ? request.source : request.points)
  , queryCount(!separate ? 0 : (request.queryGrid.empty() ? request.points.count : request.queryGrid.count()))
  , sph(request.operation == Operation::Gradient ||
      (request.operation == Operation::Smoothing && request.normalization == Normalization::SPH))
  , outputsPerComponent(request.operation == Operation::Gradient ? 3 : 1)
  , smoothingLength(request.operation == Operation::SmoothingLength)
  , reach(smoothingLength ? 0.0 : request.radius)
  , sendRadii(request.radii != nullptr)
  , sendMass(request.mass && (request.operation == Operation::Density || sph))
  , masses(request.mass)
  , regions(static_cast<std::size_t>(summary.ranks))
  , sendIndices(static_cast<std::size_t>(summary.ranks))
  , halo(summary.ranks, request.smoothed.size())
{
}

/// This rank alone, in parallel and in the input's precision: which particles it owns (not the
/// ghost points' copies) and its region (its particles and queries). Collective: the ranks agree
/// that all succeeded.
void DistributedRun::FindOwnershipAndRegion(const unsigned char* ghostFlags, Clock::time_point prologueBegan)
{
  try
  {
    this->owned = OwnershipOf(ghostFlags, this->particles.count);
    AddPoints(this->region, this->particles);
    if (this->separate && this->queryCount > 0 && this->request.queryGrid.empty())
    {
      AddPoints(this->region, this->request.points);
    }
    else if (this->separate && this->queryCount > 0)
    {
      AddGrid(this->region, this->request.queryGrid);
    }
  }
  catch (...)
  {
    this->failure = std::current_exception();
  }
  this->summary.ghostPoints = this->separate ? 0 : static_cast<std::int64_t>(this->owned.ghosts.size());
  this->summary.prologueMilliseconds = MillisecondsSince(prologueBegan); // this rank's own work only
  AgreeAllSucceeded(this->controller, this->failure);
  this->regions[static_cast<std::size_t>(this->summary.rank)] = this->region;
}

/// The halo: every rank sends each other rank its owned particles within reach of that rank's
/// region, with their masses, radii and arrays to smooth. Collective with several ranks; one
/// rank has no halo.
void DistributedRun::ExchangeHalo()
{
  this->MeasureHaloWidth();
  const auto exchangeBegan = Clock::now();
  double haloChoiceMilliseconds = 0.0; // part of the prologue, not of the exchange
  if (this->summary.ranks > 1)
  {
    this->AgreeWithOtherRanks();
    // The larger part of the prologue: a test per owned particle and other rank.
    const auto haloBegan = Clock::now();
    this->sendIndices = ChooseHalo(
      this->request, this->particles, this->owned, this->regions, this->summary.rank, this->reaches);
    for (const auto& indices : this->sendIndices)
    {
      this->summary.haloSent += static_cast<std::int64_t>(indices.size());
    }
    haloChoiceMilliseconds = MillisecondsSince(haloBegan);
    this->summary.prologueMilliseconds += haloChoiceMilliseconds;
    this->halo.Exchange(this->controller, this->sendIndices, this->request, this->particles, this->sendMass,
      this->masses, this->sendRadii);
  }
  this->summary.haloReceived = this->halo.Count();
  this->summary.exchangeMilliseconds = MillisecondsSince(exchangeBegan) - haloChoiceMilliseconds;
}

/// With per-particle radii the halo is as wide as the largest radius (here this rank's; the
/// ranks agree on the largest next).
void DistributedRun::MeasureHaloWidth()
{
  if (this->smoothingLength)
  {
    try
    {
      this->reach = this->LocalSmoothingLengthReach();
    }
    catch (...)
    {
      this->failure = std::current_exception(); // the ranks agree on it next
    }
    return;
  }
  if (!this->request.radii)
  {
    return;
  }
  const auto radiiBegan = Clock::now();
  const float* radii = this->request.radii;
  this->reach = ReduceInBlocks(
    this->particles.count, 0.0,
    [&](double& largest, std::int64_t begin, std::int64_t end) {
      for (std::int64_t i = begin; i < end; ++i)
      {
        largest = std::max(largest, static_cast<double>(radii[i]));
      }
    },
    [](double& total, double part) { total = std::max(total, part); });
  this->summary.prologueMilliseconds += MillisecondsSince(radiiBegan);
}

/// Collective: this rank's CUDA device (its place among the ranks on its host), then every
/// rank's region and whether masses and radii travel, which must not depend on one rank's data.
void DistributedRun::AgreeWithOtherRanks()
{
  this->summary.cudaDevice = NodeLocalDevice(this->controller);
  if (this->summary.cudaDevice >= 0 && this->request.backend != neighborgrid::Backend::CPU)
  {
    this->engine.setCudaDevice(this->summary.cudaDevice);
  }
  // An empty region reaches nothing.
  const bool ownReach = this->request.radii || this->smoothingLength;
  const RankAgreement agreed = AgreeOnRegions(
    this->controller, this->region, this->sendMass, this->sendRadii, ownReach ? this->reach : 0.0);
  this->regions = agreed.regions;
  this->sendMass = agreed.sendMass;
  this->sendRadii = agreed.sendRadii;
  if (this->sendRadii)
  {
    this->reach = agreed.largestRadius;
  }
  this->reaches.assign(agreed.regions.size(), this->reach);
  if (this->smoothingLength)
  {
    this->reaches = agreed.reaches;
  }
  const std::int64_t n = this->particles.count;
  if (this->sendMass && !this->masses)
  {
    this->constantMasses.resize(static_cast<std::size_t>(n));
    const float mass = static_cast<float>(this->request.constantMass);
    ParallelFor(n, [&](std::int64_t begin, std::int64_t end) {
      std::fill(this->constantMasses.begin() + begin, this->constantMasses.begin() + end, mass);
    });
    this->masses = this->constantMasses.data();
  }
  // Other ranks use radii; so must this one, for its points (a rank with points and no radii
  // would otherwise search with Radius; it cannot happen through the filters).
  std::exception_ptr radiiFailure;
  if (this->sendRadii && !this->request.radii && n > 0)
  {
    radiiFailure = std::make_exception_ptr(Error("NeighborGrid: other ranks have per-particle radii, this one has none"));
  }
  AgreeAllSucceeded(this->controller, this->failure ? this->failure : radiiFailure);
}

/// The particles this rank runs on: its owned particles, then the halo in rank order, with the
/// request on them and, at the particles, outputs for the whole set (the first owned.count are
/// this rank's).
void DistributedRun::BuildExtendedSet()
{
  const auto extendedBegan = Clock::now();
  this->ext = ExtendedSet::Of(this->request, this->particles, this->owned, this->masses, this->halo.xyz,
    this->sendMass ? &this->halo.mass : nullptr, this->sendRadii ? &this->halo.radii : nullptr, this->halo.values);
  this->run = this->ext.RequestFor(this->request, this->separate);
  const std::size_t extCount = static_cast<std::size_t>(this->ext.count());
  if (!this->separate)
  {
    if (this->request.neighborCount)
    {
      this->extCounts.resize(extCount);
      this->run.neighborCount = this->extCounts.data();
    }
    if (this->request.density)
    {
      this->extDensity.resize(extCount);
      this->run.density = this->extDensity.data();
    }
    if (this->request.supportRadius)
    {
      // The owned particles come first in the extended set: only they are queries.
      this->extSupport.resize(static_cast<std::size_t>(this->owned.count));
      this->run.supportRadius = this->extSupport.data();
      this->run.smoothingLengthQueries = this->owned.count;
    }
    for (auto& array : this->run.smoothed)
    {
      this->extOutputs.emplace_back(extCount * static_cast<std::size_t>(array.components * this->outputsPerComponent));
      array.output = this->extOutputs.back().data();
    }
  }
  this->summary.prologueMilliseconds += MillisecondsSince(extendedBegan);
}

/// SPH smoothing and the gradient: rho at every particle of the extended set (exact at this
/// rank's own, whose halo is complete), then rho of the halo points from their owners (here they
/// miss the neighbors beyond this rank's region), then the volumes m_j / rho_j the main run
/// weighs the particles by. Collective. Probe points get their density in a run of their own.
void DistributedRun::WeighByHaloDensities()
{
  if (!this->sph)
  {
    return;
  }
  this->ExtendedDensities();
  if (this->summary.ranks > 1)
  {
    this->HaloDensitiesFromOwners();
  }
  const std::int64_t extCount = this->ext.count();
  this->volumes.resize(static_cast<std::size_t>(extCount));
  const bool perParticleMass = !this->ext.mass.empty();
  const float constantMass = static_cast<float>(this->request.constantMass);
  ParallelFor(extCount, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t j = begin; j < end; ++j)
    {
      this->volumes[j] = (perParticleMass ? this->ext.mass[j] : constantMass) / this->rho[j];
    }
  });
  if (this->separate && this->request.density && extCount > 0 && this->queryCount > 0)
  {
    try
    {
      Request queryDensity = this->run;
      queryDensity.operation = Operation::Density;
      queryDensity.smoothed.clear();
      AppendStages(this->report, this->engine.run(queryDensity), "query density: ");
    }
    catch (...)
    {
      this->failure = std::current_exception();
    }
  }
  this->run.particleVolumes = this->volumes.data();
  this->run.mass = nullptr;
  this->run.density = nullptr;
}

/// Collective: rho at every particle of the extended set, from this rank's particles and halo.
void DistributedRun::ExtendedDensities()
{
  const std::int64_t extCount = this->ext.count();
  try
  {
    Request density = this->run;
    density.points = Points(this->ext.xyz.data(), extCount);
    density.source = Points();
    density.queryGrid = neighborgrid::QueryGrid();
    density.valid = nullptr;
    density.operation = Operation::Density;
    density.smoothed.clear();
    density.neighborCount = nullptr;
    this->rho.resize(static_cast<std::size_t>(extCount));
    density.density = this->rho.data();
    if (extCount > 0)
    {
      AppendStages(this->report, this->engine.run(density), "density: ");
    }
  }
  catch (...)
  {
    this->failure = std::current_exception();
  }
  AgreeAllSucceeded(this->controller, this->failure);
}

/// Collective: every rank sends the densities of the particles it sent as halo, which replace
/// the receivers' incomplete ones.
void DistributedRun::HaloDensitiesFromOwners()
{
  std::vector<float> ownRho(static_cast<std::size_t>(this->particles.count), 0.0f);
  ParallelFor(this->owned.count, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t k = begin; k < end; ++k)
    {
      ownRho[static_cast<std::size_t>(this->owned[k])] = this->rho[static_cast<std::size_t>(k)];
    }
  });
  const auto haloRho = ExchangeWithEveryRank(this->controller, Gathered(ownRho.data(), 1, this->sendIndices));
  std::size_t next = static_cast<std::size_t>(this->owned.count);
  for (const auto& h : haloRho)
  {
    std::copy(h.begin(), h.end(), this->rho.begin() + static_cast<std::ptrdiff_t>(next));
    next += h.size();
  }
}

/// The main run on the extended set; at the particles this rank keeps its owned particles'
/// results and answers its ghost points. Collective: the ranks agree that all succeeded.
void DistributedRun::Compute()
{
  const bool noParticleNear = this->ext.count() == 0 || this->queryCount == 0;
  try
  {
    if (!this->failure && this->separate && noParticleNear)
    {
      FillWithoutNeighbors(this->request); // no particle within reach on any rank
    }
    else if (!this->failure && this->separate)
    {
      this->last = this->engine.run(this->run);
    }
    else if (!this->failure)
    {
      // Smoothing Length asks for the owned particles' results only (the halo are neighbors).
      if (this->smoothingLength ? this->owned.count > 0 : this->ext.count() > 0)
      {
        this->last = this->engine.run(this->run);
      }
      WriteOwnedResults(this->request, this->owned, this->extCounts,
        this->sph ? this->rho.data() : this->extDensity.data(), this->extSupport.data(), this->extOutputs,
        this->outputsPerComponent);
      if (!this->GhostsCopyTheirParticle())
      {
        this->AnswerGhostPoints();
      }
    }
  }
  catch (...)
  {
    this->failure = std::current_exception();
  }
  AgreeAllSucceeded(this->controller, this->failure);
  if (this->GhostsCopyTheirParticle() && !this->separate)
  {
    this->AnswerGhostCopies();
  }
}

/// Ghost points (copies of other ranks' points) take the result of a query at their position
/// over the extended particle set: their owner's result less the owner's copy at distance 0.
void DistributedRun::AnswerGhostPoints()
{
  const std::vector<std::int64_t>& ghosts = this->owned.ghosts;
  if (ghosts.empty())
  {
    return;
  }
  if (this->ext.count() == 0)
  {
    throw Error("NeighborGrid: point " + std::to_string(ghosts[0]) +
      " is a ghost point (vtkGhostType DUPLICATEPOINT), but no rank owns a point at its position");
  }
  const GhostAnswers answers = this->QueryGhostPoints();
  const Request& r = this->request;
  if (r.neighborCount)
  {
    // The owner's copy lies at distance 0: a point is not its own neighbor.
    const auto orphan = std::find_if(answers.counts.begin(), answers.counts.end(), [](std::int32_t c) { return c < 1; });
    if (orphan != answers.counts.end())
    {
      throw Error("NeighborGrid: point " + std::to_string(ghosts[static_cast<std::size_t>(orphan - answers.counts.begin())]) +
        " is a ghost point (vtkGhostType DUPLICATEPOINT), but no rank owns a point at its position");
    }
  }
  ParallelFor(static_cast<std::int64_t>(ghosts.size()), [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t k = begin; k < end; ++k)
    {
      const std::int64_t to = ghosts[static_cast<std::size_t>(k)];
      if (r.neighborCount)
      {
        r.neighborCount[to] = answers.counts[k] - 1;
      }
      if (r.density)
      {
        r.density[to] = answers.density[k];
      }
      for (std::size_t a = 0; a < r.smoothed.size(); ++a)
      {
        const int c = r.smoothed[a].components;
        std::copy_n(answers.outputs[a].begin() + k * c, c, r.smoothed[a].output + to * c);
      }
    }
  });
}

/// The queries at the ghost points over the extended set (for SPH smoothing the density too,
/// in a run of its own, with the particles' masses).
GhostAnswers DistributedRun::QueryGhostPoints()
{
  const std::vector<std::int64_t>& ghosts = this->owned.ghosts;
  const std::int64_t g = static_cast<std::int64_t>(ghosts.size());
  const std::vector<std::vector<std::int64_t>> ghostList{ ghosts };
  const std::vector<double> ghostXyz = Gathered<double>(3, ghostList, CoordinateOf(this->particles))[0];
  GhostAnswers answers;
  answers.counts.resize(static_cast<std::size_t>(this->request.neighborCount ? g : 0));
  answers.density.resize(static_cast<std::size_t>(this->request.density ? g : 0));
  Request query = this->run;
  query.source = Points(this->ext.xyz.data(), this->ext.count());
  query.points = Points(ghostXyz.data(), g);
  query.neighborCount = this->request.neighborCount ? answers.counts.data() : nullptr;
  query.density = this->request.density && !this->sph ? answers.density.data() : nullptr;
  for (auto& array : query.smoothed)
  {
    answers.outputs.emplace_back(static_cast<std::size_t>(g * array.components));
    array.output = answers.outputs.back().data();
  }
  AppendStages(this->report, this->engine.run(query), "ghost points: ");
  if (this->sph && this->request.density)
  {
    Request queryDensity = query;
    queryDensity.operation = Operation::Density;
    queryDensity.smoothed.clear();
    queryDensity.particleVolumes = nullptr;
    queryDensity.mass = this->sendMass ? this->ext.mass.data() : nullptr;
    queryDensity.density = answers.density.data();
    AppendStages(this->report, this->engine.run(queryDensity), "ghost points density: ");
  }
  return answers;
}

/// Smoothing Length: how far this rank's points must see, from a first run on its own particles.
/// Every other particle can only bring a point's k-th neighbor nearer, so the k-th distance
/// among this rank's particles bounds the serial one from above (rounded up past float's
/// rounding). With k or fewer particles in an open box the bound is infinite: this rank then
/// receives every particle.
double DistributedRun::LocalSmoothingLengthReach()
{
  const std::int64_t n = this->owned.count;
  const bool periodic = this->request.periodic[0] || this->request.periodic[1] || this->request.periodic[2];
  if (n == 0)
  {
    return 0.0;
  }
  if (!periodic && n <= this->request.neighborTarget)
  {
    return HUGE_VAL;
  }
  const auto began = Clock::now();
  HostVector<double> ownedXyz;
  Request local = this->request;
  if (!this->owned.list.empty())
  {
    ownedXyz = Extended<double>(3, this->owned, {}, CoordinateOf(this->particles));
    local.points = Points(ownedXyz.data(), n);
  }
  HostVector<float> bound(static_cast<std::size_t>(n));
  local.supportRadius = bound.data();
  local.smoothingLengthQueries = -1;
  this->summary.prologueMilliseconds += MillisecondsSince(began);
  AppendStages(this->report, this->engine.run(local), "local bound: ");
  const auto reduceBegan = Clock::now();
  const double largest = ReduceInBlocks(
    n, 0.0,
    [&](double& part, std::int64_t begin, std::int64_t end) {
      for (std::int64_t i = begin; i < end; ++i)
      {
        part = std::max(part, static_cast<double>(bound[static_cast<std::size_t>(i)]));
      }
    },
    [](double& total, double part) { total = std::max(total, part); });
  this->summary.prologueMilliseconds += MillisecondsSince(reduceBegan);
  return largest * (1.0 + 1e-6);
}

/// Per rank, the results of the particles this rank sent it as halo (zeros for an output this
/// rank does not have: every rank takes part in every exchange). Collective.
struct HaloResults
{
  std::vector<std::vector<std::int32_t>> counts;
  std::vector<std::vector<float>> density, supportRadius;
  std::vector<std::vector<std::vector<float>>> outputs; // per array, per rank

  static HaloResults FromOwners(vtkMultiProcessController* controller, const Request& r,
    const std::vector<std::vector<std::int64_t>>& sendIndices, int outputsPerComponent)
  {
    HaloResults h;
    auto exchange = [&](auto* values, int width) {
      using T = std::remove_const_t<std::remove_pointer_t<decltype(values)>>;
      return ExchangeWithEveryRank(controller, Gathered<T>(width, sendIndices, [&](std::int64_t i, int c) {
        return values ? values[i * width + c] : T(0);
      }));
    };
    h.counts = exchange(r.neighborCount, 1);
    h.density = exchange(r.density, 1);
    h.supportRadius = exchange(r.supportRadius, 1);
    for (const auto& array : r.smoothed)
    {
      h.outputs.push_back(exchange(array.output, array.components * outputsPerComponent));
    }
    return h;
  }

  ParticleResults From(std::size_t rank) const
  {
    ParticleResults p;
    p.counts = counts[rank].data();
    p.density = density[rank].data();
    p.supportRadius = supportRadius[rank].data();
    for (const auto& perRank : outputs)
    {
      p.outputs.push_back(perRank[rank].data());
    }
    return p;
  }
};

/// The attributes that make a particle's result its own beyond its position: its radius (Gather
/// and Symmetric take it) and, for the gradient, its values (f_i).
struct ParticleAttributes
{
  const float* radius = nullptr;
  std::vector<std::pair<const float*, int>> values; // per array: the values and their components

  bool Same(std::int64_t i, const ParticleAttributes& other, std::int64_t j) const
  {
    if (radius && !(radius[i] == other.radius[j]))
    {
      return false;
    }
    for (std::size_t a = 0; a < values.size(); ++a)
    {
      const int c = values[a].second;
      if (!std::equal(values[a].first + i * c, values[a].first + (i + 1) * c, other.values[a].first + j * c))
      {
        return false;
      }
    }
    return true;
  }
};

/// Ghost points whose result no query at their position gives: Smoothing Length, per-particle
/// radii (a ghost has its particle's radius) and the gradient (its particle's value). A ghost
/// point is a copy of a particle that this rank or another owns: it takes the results of the
/// owned or halo particle at its position with the same radius and values, the halo's from their
/// owners. Collective.
void DistributedRun::AnswerGhostCopies()
{
  const int outputs = this->outputsPerComponent;
  const Request& r = this->request;
  int mine = this->owned.ghosts.empty() ? 0 : 1, any = mine;
  if (this->summary.ranks > 1)
  {
    this->controller->AllReduce(&mine, &any, 1, vtkCommunicator::MAX_OP);
  }
  if (!any)
  {
    return;
  }
  HaloResults haloResults;
  if (this->summary.ranks > 1)
  {
    haloResults = HaloResults::FromOwners(this->controller, r, this->sendIndices, outputs);
  }
  try
  {
    const bool gradient = r.operation == Operation::Gradient;
    ParticleAttributes ghostAttributes;
    ghostAttributes.radius = this->sendRadii ? r.radii : nullptr;
    for (std::size_t a = 0; gradient && a < r.smoothed.size(); ++a)
    {
      ghostAttributes.values.emplace_back(r.smoothed[a].values, r.smoothed[a].components);
    }
    using Position = std::array<double, 3>;
    struct PositionHash
    {
      std::size_t operator()(const Position& p) const
      {
        std::size_t h = 0;
        for (double v : p)
        {
          h = h * 1000003u ^ std::hash<double>()(v + 0.0); // -0.0 hashes as 0.0
        }
        return h;
      }
    };
    std::unordered_map<Position, std::vector<std::int64_t>, PositionHash> ghostsAt;
    for (const std::int64_t g : this->owned.ghosts)
    {
      Position x;
      ReadPoint(this->particles, g, x.data());
      ghostsAt[x].push_back(g);
    }
    // The ghosts at x with the attributes of particle i of `from` take its results.
    auto answer = [&](const Position& x, const ParticleAttributes& attributes, const ParticleResults& results,
                    std::int64_t i) {
      const auto found = ghostsAt.find(x);
      if (found == ghostsAt.end())
      {
        return;
      }
      std::vector<std::int64_t>& waiting = found->second;
      waiting.erase(std::remove_if(waiting.begin(), waiting.end(),
                      [&](std::int64_t g) {
                        const bool copy = ghostAttributes.Same(g, attributes, i);
                        if (copy)
                        {
                          results.CopyTo(r, i, g, outputs);
                        }
                        return copy;
                      }),
        waiting.end());
      if (waiting.empty())
      {
        ghostsAt.erase(found);
      }
    };
    ParticleResults ownResults;
    ownResults.counts = r.neighborCount;
    ownResults.density = r.density;
    ownResults.supportRadius = r.supportRadius;
    for (const auto& array : r.smoothed)
    {
      ownResults.outputs.push_back(array.output);
    }
    for (std::int64_t k = 0; k < this->owned.count && !ghostsAt.empty(); ++k)
    {
      Position x;
      ReadPoint(this->particles, this->owned[k], x.data());
      answer(x, ghostAttributes, ownResults, this->owned[k]);
    }
    for (std::size_t from = 0; from < haloResults.counts.size() && !ghostsAt.empty(); ++from)
    {
      const std::vector<double>& xyz = this->halo.xyz[from];
      ParticleAttributes haloAttributes;
      haloAttributes.radius = this->sendRadii ? this->halo.radii[from].data() : nullptr;
      for (std::size_t a = 0; gradient && a < r.smoothed.size(); ++a)
      {
        haloAttributes.values.emplace_back(this->halo.values[a][from].data(), r.smoothed[a].components);
      }
      const ParticleResults results = haloResults.From(from);
      for (std::size_t m = 0; m < xyz.size() / 3 && !ghostsAt.empty(); ++m)
      {
        answer(Position{ xyz[3 * m], xyz[3 * m + 1], xyz[3 * m + 2] }, haloAttributes, results,
          static_cast<std::int64_t>(m));
      }
    }
    if (!ghostsAt.empty())
    {
      throw Error("NeighborGrid: point " + std::to_string(ghostsAt.begin()->second[0]) +
        " is a ghost point (vtkGhostType DUPLICATEPOINT), but no rank owns a point at its position" +
        (this->sendRadii || gradient ? " with the same radius and values" : ""));
    }
  }
  catch (...)
  {
    this->failure = std::current_exception();
  }
  AgreeAllSucceeded(this->controller, this->failure);
}

/// The report of the whole run: this rank's prologue and exchange, the stages before the main
/// run, then the main run's; at the particles the neighbor pairs of this rank's own points (the
/// ranks' sums add up to the serial one).
Report DistributedRun::MergedReport() const
{
  Report merged = this->last;
  merged.stages.clear();
  merged.stages.push_back({ "distributed prologue", this->summary.prologueMilliseconds });
  merged.stages.push_back({ "halo exchange", this->summary.exchangeMilliseconds });
  AppendStages(merged, this->report, "");
  merged.pairsDecidedInDouble = this->report.pairsDecidedInDouble;
  AppendStages(merged, this->last, "");
  if (this->request.neighborCount && !this->separate)
  {
    const std::int32_t* counts = this->request.neighborCount;
    const Ownership& own = this->owned;
    merged.neighborPairs = ReduceInBlocks(
      own.count, std::int64_t(0),
      [&](std::int64_t& pairs, std::int64_t begin, std::int64_t end) {
        for (std::int64_t k = begin; k < end; ++k)
        {
          pairs += counts[own[k]];
        }
      },
      [](std::int64_t& total, std::int64_t part) { total += part; });
  }
  return merged;
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
  summary = DistributedSummary();
  summary.ranks = RankCount(controller);
  summary.rank = summary.ranks > 1 ? controller->GetLocalProcessId() : 0;
  const Points& particles = queriesAreParticles ? request.points : request.source;

  // The path of almost every run: one process and no ghost points. Nothing to exchange and
  // nothing to leave out, so the caller's arrays go to the engine as they are: no pass over the
  // points here (a ghost array, where there is one, is only scanned for ghost points).
  const auto prologueBegan = Clock::now();
  if (summary.ranks == 1 && !AnyGhostPoint(ghostFlags, particles.count))
  {
    return engine.run(request);
  }

  // Several ranks, or ghost points to leave out: the stages, each collective where it talks to
  // the other ranks.
  DistributedRun run(engine, request, !queriesAreParticles, controller, summary);
  run.FindOwnershipAndRegion(ghostFlags, prologueBegan); // this rank's owned particles and region
  run.ExchangeHalo();                                    // the particles near other ranks' regions
  run.BuildExtendedSet();                                // owned particles, then the halo
  run.WeighByHaloDensities();                            // SPH smoothing and the gradient only
  run.Compute();                                         // owned results, then the ghost points'
  return run.MergedReport();
}

} // namespace neighborgrid_filters
