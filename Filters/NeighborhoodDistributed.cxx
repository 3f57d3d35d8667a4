#include "NeighborhoodDistributed.h"

#include <vtkDataSetAttributes.h>
#include <vtkMultiProcessController.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
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

std::vector<double> ToDouble(const Points& p)
{
  std::vector<double> out(static_cast<std::size_t>(3 * p.count));
  if (p.type == neighborgrid::ScalarType::Float64)
  {
    std::copy_n(static_cast<const double*>(p.xyz), out.size(), out.begin());
  }
  else
  {
    std::copy_n(static_cast<const float*>(p.xyz), out.size(), out.begin());
  }
  return out;
}

void AddPoints(Region& g, const Points& p)
{
  const std::vector<double> x = ToDouble(p);
  for (std::int64_t i = 0; i < p.count; ++i)
  {
    g.add(&x[3 * i]);
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

/// Per rank k, `components` values per particle of sendIndices[k], gathered from `values`.
template <class T>
std::vector<std::vector<T>> Gathered(const T* values, int components,
  const std::vector<std::vector<std::int64_t>>& sendIndices)
{
  std::vector<std::vector<T>> out(sendIndices.size());
  for (std::size_t k = 0; k < sendIndices.size(); ++k)
  {
    out[k].reserve(sendIndices[k].size() * static_cast<std::size_t>(components));
    for (std::int64_t i : sendIndices[k])
    {
      out[k].insert(out[k].end(), values + i * components, values + (i + 1) * components);
    }
  }
  return out;
}

/// This rank's own values (at `owned`, `components` each) followed by what every rank sent, in
/// rank order: the layout of the extended particle set.
template <class T>
std::vector<T> Extended(const T* values, int components, const std::vector<std::int64_t>& owned,
  const std::vector<std::vector<T>>& received)
{
  std::vector<T> out;
  std::size_t total = owned.size() * static_cast<std::size_t>(components);
  for (const auto& r : received)
  {
    total += r.size();
  }
  out.reserve(total);
  for (std::int64_t i : owned)
  {
    out.insert(out.end(), values + i * components, values + (i + 1) * components);
  }
  for (const auto& r : received)
  {
    out.insert(out.end(), r.begin(), r.end());
  }
  return out;
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

  // --- This rank: its particles in double, which it owns, and its region -------------------
  std::vector<double> xyz;
  std::vector<std::int64_t> owned, ghosts;
  Region region;
  std::exception_ptr failure;
  try
  {
    xyz = ToDouble(particles);
    for (std::int64_t i = 0; i < n; ++i)
    {
      const bool copy = ghostFlags && (ghostFlags[i] & vtkDataSetAttributes::DUPLICATEPOINT);
      (copy ? ghosts : owned).push_back(i);
      region.add(&xyz[3 * i]);
    }
    // Ghost points among the particles are answered by a query at their position over the
    // particles, which takes neither a gradient (grad f_i needs f_i) nor a radius of its own
    // (Gather, Symmetric). (With separate queries they are only left out of the particles.)
    const bool radiiOrGradient = request.radii || request.operation == Operation::Gradient;
    if (radiiOrGradient && ghostFlags && !separate)
    {
      for (std::int64_t i = 0; i < n; ++i)
      {
        if (ghostFlags[i] & vtkDataSetAttributes::DUPLICATEPOINT)
        {
          throw Error("NeighborGrid: point " + std::to_string(i) +
            " is a ghost point (vtkGhostType DUPLICATEPOINT); " +
            (request.radii ? "a radius array (per-particle radii)" : "the Gradient operation") +
            " is not supported with ghost points yet: remove them first (Remove Ghost Information)");
        }
      }
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
  summary.ghostPoints = separate ? 0 : static_cast<std::int64_t>(ghosts.size());
  AgreeAllSucceeded(controller, failure);
  if (ranks == 1 && ghosts.empty())
  {
    return engine.run(request); // nothing to exchange, nothing to leave out
  }

  const auto exchangeBegan = std::chrono::steady_clock::now();
  std::vector<Region> regions(static_cast<std::size_t>(ranks));
  regions[static_cast<std::size_t>(summary.rank)] = region;
  std::vector<std::vector<std::int64_t>> sendIndices(static_cast<std::size_t>(ranks));
  std::vector<std::vector<double>> haloXyz(static_cast<std::size_t>(ranks));
  std::vector<std::vector<float>> haloMass(static_cast<std::size_t>(ranks));
  std::vector<std::vector<std::vector<float>>> haloValues(request.smoothed.size());
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
    reach = 0.0;
    for (std::int64_t i = 0; i < n; ++i)
    {
      reach = std::max(reach, static_cast<double>(request.radii[i]));
    }
  }
  std::vector<std::vector<float>> haloRadii(static_cast<std::size_t>(ranks));
  // Whether masses travel must not depend on this rank's data (a rank without points may hold no
  // mass array): the ranks agree below; a rank without a mass array sends its constant mass.
  bool sendMass = request.mass && (request.operation == Operation::Density || sph);
  std::vector<float> constantMasses;
  const float* masses = request.mass;
  if (ranks > 1)
  {
    // Which device: the rank's place among the ranks on its host.
    summary.cudaDevice = NodeLocalDevice(controller);
    if (summary.cudaDevice >= 0 && request.backend != neighborgrid::Backend::CPU)
    {
      engine.setCudaDevice(summary.cudaDevice);
    }
    // Every rank's region (an empty one reaches nothing).
    constexpr int entries = 9; // region (6), sends masses, sends radii, largest radius
    std::vector<double> mine(entries), all(entries * static_cast<std::size_t>(ranks));
    for (int a = 0; a < 3; ++a)
    {
      mine[a] = region.lo[a];
      mine[3 + a] = region.hi[a];
    }
    mine[6] = sendMass ? 1.0 : 0.0;
    mine[7] = sendRadii ? 1.0 : 0.0;
    mine[8] = request.radii ? reach : 0.0;
    controller->AllGather(mine.data(), all.data(), entries);
    for (int k = 0; k < ranks; ++k)
    {
      for (int a = 0; a < 3; ++a)
      {
        regions[k].lo[a] = all[entries * k + a];
        regions[k].hi[a] = all[entries * k + 3 + a];
      }
      sendMass = sendMass || all[entries * k + 6] != 0.0;
      sendRadii = sendRadii || all[entries * k + 7] != 0.0;
    }
    if (sendRadii)
    {
      reach = 0.0;
      for (int k = 0; k < ranks; ++k)
      {
        reach = std::max(reach, all[entries * k + 8]);
      }
    }
    if (sendMass && !masses)
    {
      constantMasses.assign(static_cast<std::size_t>(n), static_cast<float>(request.constantMass));
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
    for (int k = 0; k < ranks; ++k)
    {
      if (k == summary.rank)
      {
        continue;
      }
      for (std::int64_t i : owned)
      {
        if (Reaches(request, reach, &xyz[3 * i], regions[k]))
        {
          sendIndices[k].push_back(i);
        }
      }
      summary.haloSent += static_cast<std::int64_t>(sendIndices[k].size());
    }
    haloXyz = ExchangeWithEveryRank(controller, Gathered(xyz.data(), 3, sendIndices));
    if (sendMass)
    {
      haloMass = ExchangeWithEveryRank(controller, Gathered(masses, 1, sendIndices));
    }
    if (sendRadii)
    {
      haloRadii = ExchangeWithEveryRank(controller, Gathered(request.radii, 1, sendIndices));
    }
    for (std::size_t a = 0; a < request.smoothed.size(); ++a)
    {
      haloValues[a] = ExchangeWithEveryRank(
        controller, Gathered(request.smoothed[a].values, request.smoothed[a].components, sendIndices));
    }
  }
  for (const auto& h : haloXyz)
  {
    summary.haloReceived += static_cast<std::int64_t>(h.size() / 3);
  }
  summary.exchangeMilliseconds =
    std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - exchangeBegan).count();

  // --- The extended particle set: owned particles, then the halo in rank order --------------
  const std::vector<double> extXyz = Extended(xyz.data(), 3, owned, haloXyz);
  const std::int64_t extCount = static_cast<std::int64_t>(extXyz.size() / 3);
  const std::int64_t ownedCount = static_cast<std::int64_t>(owned.size());
  const std::vector<float> extMass = sendMass ? Extended(masses, 1, owned, haloMass) : std::vector<float>();
  const std::vector<float> extRadii = sendRadii ? Extended(request.radii, 1, owned, haloRadii) : std::vector<float>();
  std::vector<std::vector<float>> extValues;
  for (std::size_t a = 0; a < request.smoothed.size(); ++a)
  {
    extValues.push_back(
      Extended(request.smoothed[a].values, request.smoothed[a].components, owned, haloValues[a]));
  }

  Request run = request;
  run.mass = sendMass ? extMass.data() : nullptr;
  run.radii = sendRadii ? extRadii.data() : nullptr;
  for (std::size_t a = 0; a < run.smoothed.size(); ++a)
  {
    run.smoothed[a].values = extValues[a].data();
  }
  if (separate)
  {
    run.source = Points(extXyz.data(), extCount);
  }
  else
  {
    run.points = Points(extXyz.data(), extCount);
  }
  // Particle mode: outputs for the whole extended set; the first ownedCount are this rank's.
  std::vector<std::int32_t> extCounts;
  std::vector<float> extDensity;
  std::vector<std::vector<float>> extOutputs;
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

  Report report;
  std::vector<float> rho, volumes;
  if (sph)
  {
    // rho at every particle of this rank (its halo makes it exact), then rho of the halo points
    // from their owners: here they miss the neighbors that lie beyond this rank's region.
    try
    {
      Request density = run;
      density.points = Points(extXyz.data(), extCount);
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
    if (ranks > 1)
    {
      std::vector<float> ownRho(static_cast<std::size_t>(n), 0.0f);
      for (std::int64_t k = 0; k < ownedCount; ++k)
      {
        ownRho[static_cast<std::size_t>(owned[k])] = rho[static_cast<std::size_t>(k)];
      }
      const auto haloRho = ExchangeWithEveryRank(controller, Gathered(ownRho.data(), 1, sendIndices));
      std::size_t next = static_cast<std::size_t>(ownedCount);
      for (const auto& h : haloRho)
      {
        std::copy(h.begin(), h.end(), rho.begin() + next);
        next += h.size();
      }
    }
    volumes.resize(static_cast<std::size_t>(extCount));
    for (std::size_t j = 0; j < volumes.size(); ++j)
    {
      volumes[j] = (sendMass ? extMass[j] : static_cast<float>(request.constantMass)) / rho[j];
    }
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
      if (!separate)
      {
        // This rank's particles: results in input order.
        for (std::int64_t k = 0; k < ownedCount; ++k)
        {
          const std::size_t from = static_cast<std::size_t>(k);
          const std::int64_t to = owned[k];
          if (request.neighborCount)
          {
            request.neighborCount[to] = extCounts[from];
          }
          if (request.density)
          {
            request.density[to] = sph ? rho[from] : extDensity[from];
          }
          for (std::size_t a = 0; a < request.smoothed.size(); ++a)
          {
            const int c = request.smoothed[a].components * outputsPerComponent;
            std::copy_n(extOutputs[a].begin() + k * c, c, request.smoothed[a].output + to * c);
          }
        }
        if (!ghosts.empty() && extCount == 0)
        {
          throw Error("NeighborGrid: point " + std::to_string(ghosts[0]) +
            " is a ghost point (vtkGhostType DUPLICATEPOINT), but no rank owns a point at its position");
        }
        if (!ghosts.empty())
        {
          // Copies of other ranks' points: a query at their position over the particles.
          const std::int64_t g = static_cast<std::int64_t>(ghosts.size());
          std::vector<double> ghostXyz(static_cast<std::size_t>(3 * g));
          for (std::int64_t k = 0; k < g; ++k)
          {
            std::copy_n(&xyz[3 * ghosts[k]], 3, &ghostXyz[3 * k]);
          }
          Request query = run;
          query.source = Points(extXyz.data(), extCount);
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
            queryDensity.mass = sendMass ? extMass.data() : nullptr;
            queryDensity.density = density.data();
            AppendStages(report, engine.run(queryDensity), "ghost points density: ");
          }
          for (std::int64_t k = 0; k < g; ++k)
          {
            const std::int64_t to = ghosts[k];
            if (request.neighborCount)
            {
              // The owner's copy lies at distance 0: a point is not its own neighbor.
              if (counts[k] < 1)
              {
                throw Error("NeighborGrid: point " + std::to_string(to) +
                  " is a ghost point (vtkGhostType DUPLICATEPOINT), but no rank owns a point at its position");
              }
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
        }
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
  merged.stages.push_back({ "halo exchange", summary.exchangeMilliseconds });
  AppendStages(merged, report, "");
  merged.pairsDecidedInDouble = report.pairsDecidedInDouble;
  AppendStages(merged, last, "");
  if (request.neighborCount && !separate)
  {
    merged.neighborPairs = 0; // this rank's own points: the ranks' sums add up to the serial one
    for (std::int64_t i : owned)
    {
      merged.neighborPairs += request.neighborCount[i];
    }
  }
  return merged;
}

} // namespace neighborgrid_filters
