// Per-particle radii and the gradient: levels, searches and sums (Radii.h).
#include "Radii.h"

#include "Backend.h"
#include "Parallel.h"
#include "Slabs.h"
#include "Timer.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <sstream>
#include <utility>

namespace neighborgrid
{
namespace detail
{
namespace
{

/// Leaves a vector's new elements uninitialized: host buffers that a parallel pass writes whole,
/// so their pages are first touched by every thread instead of zeroed by one (4M particles' sums
/// of a 3-component gradient are 335 MB).
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
using HostBuffer = std::vector<T, UninitializedAllocator<T>>;

/// One sum at the queries, `terms` a query: one search's sums as the backend wrote them (float
/// sums, int32 counts), or where several searches add theirs, their sums in double.
struct QuerySums
{
  int terms = 1;
  bool oneSearch = false;
  HostBuffer<float> searched;
  HostBuffer<std::int32_t> searchedCounts;
  HostBuffer<double> added;
  HostBuffer<std::int64_t> addedCounts;

  double operator()(std::int64_t q, int t) const
  {
    const std::size_t at = static_cast<std::size_t>(q * terms + t);
    return oneSearch ? double(searched[at]) : added[at];
  }
  std::int64_t count(std::int64_t q) const { return oneSearch ? searchedCounts[q] : addedCounts[q]; }
  /// Whether the query has a neighbor (the last term counts them).
  bool any(std::int64_t q) const { return (*this)(q, terms - 1) > 0.0; }
};

/// Particles whose radii lie within a factor of 2: (R_min 2^(k-1), R_min 2^k].
struct Level
{
  std::vector<std::int64_t> members; // particle indices, ascending; empty with `all`
  bool all = false;                  // every particle, in input order (a fixed radius)
  float bound = 0.0f;                // the largest radius among the members
  std::vector<double> coordinates;   // the members' coordinates, made on first use
  std::vector<float> radii;
  std::int64_t size(std::int64_t n) const { return all ? n : std::int64_t(members.size()); }
};

/// One search: a level's particles as the queries (Gather, Symmetric's first half) or as the
/// sources (Scatter, Symmetric's second half).
struct Search
{
  std::size_t level;
  bool levelIsQueries;
  bool secondHalf;
};

/// The smallest and largest of the particles' radii, found in parallel; an Error naming the first
/// radius that is not finite and in [1e-150, 1e150] (so > 0).
struct RadiusRange
{
  float smallest, largest;
};

RadiusRange checkedRadiusRange(const Request& r, int threads)
{
  const bool separate = hasSeparateSource(r);
  const std::int64_t n = separate ? r.source.count : r.points.count;
  const int slices = static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>(threads, n / 65536)));
  std::vector<std::int64_t> firstBad(slices, -1);
  std::vector<RadiusRange> range(slices, RadiusRange{ HUGE_VALF, 0.0f });
  // A float radius is finite and > 0 (so within [1e-150, 1e150]) exactly where its bits lie in
  // [1, 0x7f7fffff]; there, the bits order as the values do. Blocks without a branch in the loop
  // vectorize (4M radii: 3.5 -> 1.4 ms on one core); a block with a bad radius is searched again.
  parallelSlices(slices, n, [&](int slice, std::int64_t begin, std::int64_t end) {
    std::uint32_t smallest = ~0u, largest = 0u;
    for (std::int64_t block = begin; block < end; block += 4096)
    {
      const std::int64_t stop = std::min(end, block + 4096);
      std::uint32_t bad = 0u;
      for (std::int64_t i = block; i < stop; ++i)
      {
        std::uint32_t bits;
        std::memcpy(&bits, r.radii + i, sizeof bits);
        bad |= bits - 1u > 0x7f7ffffeu ? 1u : 0u;
        smallest = std::min(smallest, bits);
        largest = std::max(largest, bits);
      }
      if (bad)
      {
        firstBad[slice] = std::find_if(r.radii + block, r.radii + stop, [](float radius) {
          return !(radius > 0.0f && radius <= std::numeric_limits<float>::max());
        }) - r.radii;
        return;
      }
    }
    std::memcpy(&range[slice].smallest, &smallest, sizeof smallest);
    std::memcpy(&range[slice].largest, &largest, sizeof largest);
  });
  for (std::int64_t i : firstBad)
  {
    if (i >= 0)
    {
      std::ostringstream s;
      s << "NeighborGrid: the radius of " << (separate ? "source point " : "point ") << i << " is " << r.radii[i]
        << "; every radius must be finite and > 0";
      throw Error(s.str());
    }
  }
  RadiusRange all{ HUGE_VALF, 0.0f };
  for (const RadiusRange& part : range)
  {
    all.smallest = std::min(all.smallest, part.smallest);
    all.largest = std::max(all.largest, part.largest);
  }
  return all;
}

class RadiusRun
{
public:
  RadiusRun(const Request& request, int threads, const RadiusSearch& search, bool wholeRule)
    : r_(request), threads_(std::max(1, threads)), search_(search), separate_(hasSeparateSource(request)),
      wholeRuleSearch_(wholeRule), wholeRule_(wholeRule && !separate_), particles_(separate_ ? request.source : request.points),
      n_(particles_.count), m_(separate_ ? queryCount(request) : n_)
  {
  }

  Report run()
  {
    if (n_ > maxPointsPerRun || m_ > maxPointsPerRun)
    {
      std::ostringstream s;
      s << "NeighborGrid: with per-particle radii or a gradient, a request runs in one run of the backend, of at "
        << "most " << maxPointsPerRun << " points and queries (this one has " << n_ << " and " << m_ << ")";
      throw Error(s.str());
    }
    if (!wholeRule_)
    {
      // The whole-rule backend (the GPU) checks the coordinates itself, naming the caller's point,
      // before it writes any output.
      double lo[3], hi[3];
      findBoundsOnHost(particles_, threads_, lo, hi); // names the caller's point if one is not finite
    }
    if (wholeRule_)
    {
      // One search over all particles per sum; the radii are still checked first.
      levels_.resize(1);
      levels_[0].all = true;
      levels_[0].bound = r_.radii ? checkedRadiusRange(r_, threads_).largest : static_cast<float>(r_.radius);
      searches_.push_back({ 0, true, false });
    }
    else
    {
      makeLevels();
      planSearches();
    }
    report_.radiusLevels = r_.radii ? static_cast<int>(levels_.size()) : 0;
    switch (r_.operation)
    {
      case Operation::NeighborCount:
        runCount();
        break;
      case Operation::Density:
        runDensity();
        break;
      case Operation::Smoothing:
      case Operation::Gradient:
        runArrays();
        break;
      case Operation::SmoothingLength:
        break; // not a radius layer operation (SmoothingLength.h)
    }
    return report_;
  }

private:
  // --- levels and searches ---------------------------------------------------------------------

  void makeLevels()
  {
    if (!r_.radii)
    {
      levels_.resize(1);
      levels_[0].all = true;
      levels_[0].bound = static_cast<float>(r_.radius);
      return;
    }
    const float* radii = r_.radii;
    const double smallestRadius = checkedRadiusRange(r_, threads_).smallest;
    const int slices = static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>(threads_, n_ / 65536)));
    std::vector<std::uint16_t> levelOf(static_cast<std::size_t>(n_));
    int top = 0;
    std::vector<int> tops(slices, 0);
    parallelSlices(slices, n_, [&](int slice, std::int64_t begin, std::int64_t end) {
      for (std::int64_t i = begin; i < end; ++i)
      {
        const double radius = radii[i];
        int k = radius <= smallestRadius ? 0 : static_cast<int>(std::ceil(std::log2(radius / smallestRadius)));
        while (k > 0 && radius <= std::ldexp(smallestRadius, k - 1))
        {
          --k;
        }
        while (radius > std::ldexp(smallestRadius, k))
        {
          ++k;
        }
        levelOf[i] = static_cast<std::uint16_t>(k); // k < 400: float radii span less than 2^300
        tops[slice] = std::max(tops[slice], k);
      }
    });
    top = *std::max_element(tops.begin(), tops.end());
    std::vector<Level> all(static_cast<std::size_t>(top) + 1);
    for (std::int64_t i = 0; i < n_; ++i)
    {
      Level& level = all[levelOf[i]];
      level.members.push_back(i);
      level.bound = std::max(level.bound, radii[i]);
    }
    for (Level& level : all)
    {
      if (!level.members.empty())
      {
        levels_.push_back(std::move(level));
      }
    }
  }

  void planSearches()
  {
    const SmoothingLengthMode mode = r_.radii ? r_.smoothingLengthMode : SmoothingLengthMode::Gather;
    for (std::size_t k = 0; k < levels_.size(); ++k)
    {
      if (mode != SmoothingLengthMode::Scatter)
      {
        searches_.push_back({ k, true, false });
      }
    }
    for (std::size_t k = 0; k < levels_.size(); ++k)
    {
      if (mode != SmoothingLengthMode::Gather)
      {
        searches_.push_back({ k, false, mode == SmoothingLengthMode::Symmetric });
      }
    }
  }

  // --- the members' data, compacted ------------------------------------------------------------

  Points levelPoints(Level& level)
  {
    if (level.all)
    {
      return particles_;
    }
    const std::int64_t count = std::int64_t(level.members.size());
    if (level.coordinates.empty())
    {
      level.coordinates.resize(3 * level.members.size());
      parallelFor(threads_, count, 65536, nullptr, 0.0, 0.0, "", [&](std::int64_t begin, std::int64_t end) {
        for (std::int64_t k = begin; k < end; ++k)
        {
          const std::int64_t i = level.members[k];
          for (int a = 0; a < 3; ++a)
          {
            level.coordinates[3 * k + a] = particles_.type == ScalarType::Float32
              ? double(static_cast<const float*>(particles_.xyz)[3 * i + a])
              : static_cast<const double*>(particles_.xyz)[3 * i + a];
          }
        }
      });
    }
    // Float input converted to double exactly: every pair's distance is the caller's.
    return Points(level.coordinates.data(), count);
  }

  /// `components` floats per member from an array of `components` per particle (null: null).
  const float* gather(const Level& level, const float* perParticle, int components, std::vector<float>& out)
  {
    if (!perParticle || level.all)
    {
      return perParticle;
    }
    const std::int64_t count = std::int64_t(level.members.size());
    out.resize(static_cast<std::size_t>(count) * components);
    parallelFor(threads_, count, 65536, nullptr, 0.0, 0.0, "", [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t k = begin; k < end; ++k)
      {
        const float* from = perParticle + level.members[k] * components;
        std::copy(from, from + components, out.data() + k * components);
      }
    });
    return out.data();
  }

  const float* levelRadii(Level& level)
  {
    if (!r_.radii)
    {
      return nullptr;
    }
    if (level.radii.empty() && !level.all)
    {
      gather(level, r_.radii, 1, level.radii);
    }
    return level.all ? r_.radii : level.radii.data();
  }

  // --- one sum over every search ---------------------------------------------------------------

  /// body(k) for every k in [0, count), on every thread.
  template <class Body>
  void forEach(std::int64_t count, const Body& body) const
  {
    parallelFor(threads_, count, 65536, nullptr, 0.0, 0.0, "", [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t k = begin; k < end; ++k)
      {
        body(k);
      }
    });
  }

  /// Host work on the sums and results, timed into the report's "radius sums" stage.
  template <class Pass>
  void hostPass(const Pass& pass)
  {
    Timer timer;
    pass();
    addStage(report_, "radius sums", timer.milliseconds());
  }

  /// `sum` over every search at the queries. Weights w_j: `weights` per particle or
  /// `constantWeight`; values: `components` per particle.
  QuerySums runSum(RadiusSum sum, const float* weights, float constantWeight, const float* values, int components)
  {
    RadiusPass pass;
    pass.sum = sum;
    pass.mode = r_.radii ? r_.smoothingLengthMode : SmoothingLengthMode::Gather;
    pass.constantRadius = r_.radius;
    pass.components = components;
    pass.wholeRule = wholeRule_;
    const int terms = pass.terms();
    QuerySums sums;
    sums.terms = terms;
    // One search over every query in order (the whole rule, or a fixed radius) writes the sums
    // that are kept; several add theirs to zeros in double.
    sums.oneSearch = searches_.size() == 1 && (levels_[searches_[0].level].all || !searches_[0].levelIsQueries);
    if (!sums.oneSearch)
    {
      hostPass([&] {
        if (sum == RadiusSum::Count)
        {
          sums.addedCounts.resize(static_cast<std::size_t>(m_));
          forEach(m_, [&](std::int64_t q) { sums.addedCounts[q] = 0; });
        }
        else
        {
          sums.added.resize(static_cast<std::size_t>(m_) * terms);
          forEach(m_, [&](std::int64_t q) { std::fill_n(sums.added.data() + q * terms, terms, 0.0); });
        }
      });
    }
    std::vector<float> sourceWeights, sourceValues, queryValues;
    HostBuffer<float>& floatSums = sums.searched;
    HostBuffer<std::int32_t>& intCounts = sums.searchedCounts;
    for (const Search& s : searches_)
    {
      Level& level = levels_[s.level];
      Request q;
      q.kernel = r_.kernel;
      q.dimension = r_.dimension;
      q.backend = r_.backend;
      q.method = r_.method;
      q.operation = Operation::Density; // what the backend's memory plan and uploads see
      q.radius = r_.radii ? double(level.bound) : r_.radius;
      q.constantMass = constantWeight;
      pass.secondHalf = s.secondHalf;
      std::int64_t queries;
      if (s.levelIsQueries)
      {
        q.points = levelPoints(level);
        q.source = particles_;
        q.mass = weights;
        pass.queryRadii = levelRadii(level);
        pass.sourceRadii = r_.radii;
        pass.sourceValues = values;
        pass.queryValues = sum == RadiusSum::Gradient ? gather(level, values, components, queryValues) : nullptr;
        queries = level.size(n_);
      }
      else
      {
        q.source = levelPoints(level);
        if (separate_)
        {
          q.points = r_.points;
          q.queryGrid = r_.queryGrid;
        }
        else
        {
          q.points = particles_;
        }
        q.mass = gather(level, weights, 1, sourceWeights);
        pass.queryRadii = separate_ ? nullptr : r_.radii;
        pass.sourceRadii = levelRadii(level);
        pass.sourceValues = gather(level, values, components, sourceValues);
        pass.queryValues = sum == RadiusSum::Gradient ? values : nullptr;
        queries = m_;
      }
      if (sum == RadiusSum::Count)
      {
        intCounts.resize(static_cast<std::size_t>(queries));
        pass.counts = intCounts.data();
      }
      else
      {
        floatSums.resize(static_cast<std::size_t>(queries) * terms);
        pass.sums = floatSums.data();
      }
      const double done = double(searchesDone_), total = double(searchesPlanned());
      const ProgressCallback& parent = r_.progress;
      if (parent)
      {
        q.progress = [&parent, done, total](double fraction, const char* stage) {
          return parent((done + fraction) / total, stage);
        };
      }
      // A search that does not fit throws DoesNotFit before any output is written: the engine
      // then runs the request in slabs (Slabs.h), this layer in each.
      const Report searched = search_(q, pass);
      merge(searched);
      ++searchesDone_;
      if (sums.oneSearch)
      {
        break;
      }
      const std::vector<std::int64_t>* members = s.levelIsQueries && !level.all ? &level.members : nullptr;
      hostPass([&] {
        forEach(queries, [&](std::int64_t k) {
          const std::int64_t query = members ? (*members)[k] : k;
          if (sum == RadiusSum::Count)
          {
            sums.addedCounts[query] += intCounts[k];
          }
          else
          {
            for (int t = 0; t < terms; ++t)
            {
              sums.added[query * terms + t] += floatSums[k * terms + t];
            }
          }
        });
      });
    }
    if (!sums.oneSearch)
    {
      HostBuffer<float>().swap(sums.searched); // the last search's part, added
      HostBuffer<std::int32_t>().swap(sums.searchedCounts);
    }
    return sums;
  }

  int searchesPlanned() const
  {
    int sums = 1;
    if (r_.operation == Operation::Smoothing || r_.operation == Operation::Gradient)
    {
      sums = 0;
      for (const auto& a : r_.smoothed)
      {
        sums += (a.components + maxComponentsPerPass - 1) / maxComponentsPerPass;
      }
      const bool volumes = r_.operation == Operation::Gradient || r_.normalization == Normalization::SPH;
      sums += volumes && !r_.particleVolumes ? 1 : 0;
      sums += volumes && separate_ && r_.density ? 1 : 0;
    }
    return std::max<int>(searchesDone_ + 1, sums * static_cast<int>(searches_.size()));
  }

  void merge(const Report& searched)
  {
    if (report_.radiusSearches == 0)
    {
      report_.backend = searched.backend;
      report_.method = searched.method;
      report_.device = searched.device;
      report_.backendReason = searched.backendReason;
    }
    ++report_.radiusSearches;
    for (const StageTime& stage : searched.stages)
    {
      addStage(report_, stage.stage, stage.milliseconds);
    }
    report_.pairsDecidedInDouble += searched.pairsDecidedInDouble;
    report_.extraDeviceBytes = std::max(report_.extraDeviceBytes, searched.extraDeviceBytes);
  }

  // --- operations ------------------------------------------------------------------------------

  void writeValid(const QuerySums& sums)
  {
    if (r_.valid)
    {
      forEach(m_, [&](std::int64_t q) { r_.valid[q] = sums.any(q) ? 1 : 0; });
    }
  }

  void runCount()
  {
    const QuerySums counts = runSum(RadiusSum::Count, nullptr, 1.0f, nullptr, 1);
    // A particle meets itself once (in the search where its own radius decides, r = 0).
    const std::int64_t itself = separate_ ? 0 : 1;
    std::atomic<std::int64_t> pairs{ 0 }, firstTooMany{ m_ };
    hostPass([&] {
      parallelFor(threads_, m_, 65536, nullptr, 0.0, 0.0, "", [&](std::int64_t begin, std::int64_t end) {
        std::int64_t slicePairs = 0;
        for (std::int64_t q = begin; q < end; ++q)
        {
          const std::int64_t count = counts.count(q) - itself;
          if (count > std::numeric_limits<std::int32_t>::max())
          {
            std::int64_t first = firstTooMany.load();
            while (q < first && !firstTooMany.compare_exchange_weak(first, q))
            {
            }
          }
          slicePairs += count;
        }
        pairs += slicePairs;
      });
    });
    if (firstTooMany < m_)
    {
      const std::int64_t q = firstTooMany;
      throw Error("NeighborGrid: point " + std::to_string(q) + " has " + std::to_string(counts.count(q) - itself) +
        " neighbors, more than an int32 count holds");
    }
    hostPass([&] {
      forEach(m_, [&](std::int64_t q) {
        const std::int64_t count = counts.count(q) - itself;
        r_.neighborCount[q] = static_cast<std::int32_t>(count);
        if (r_.valid)
        {
          r_.valid[q] = count > 0 ? 1 : 0;
        }
      });
    });
    report_.neighborPairs = pairs;
  }

  /// rho at the queries with the caller's masses.
  QuerySums density() { return runSum(RadiusSum::Density, r_.mass, static_cast<float>(r_.constantMass), nullptr, 1); }

  void runDensity()
  {
    const QuerySums sums = density();
    hostPass([&] {
      forEach(m_, [&](std::int64_t q) { r_.density[q] = static_cast<float>(sums(q, 0)); });
      writeValid(sums);
    });
  }

  /// V_j = m_j / rho_j at every particle: the caller's, or from the density over every search
  /// (with a separate source, the sources' own density in the same mode, a run of its own).
  HostBuffer<float> particleVolumes(HostBuffer<float>* particleDensity)
  {
    HostBuffer<float> volumes(static_cast<std::size_t>(n_));
    if (r_.particleVolumes)
    {
      hostPass([&] { forEach(n_, [&](std::int64_t i) { volumes[i] = r_.particleVolumes[i]; }); });
      return volumes;
    }
    HostBuffer<float> rho(static_cast<std::size_t>(n_));
    if (separate_)
    {
      Request own = r_;
      own.points = r_.source;
      own.source = Points();
      own.queryGrid = QueryGrid();
      own.operation = Operation::Density;
      own.density = rho.data();
      own.valid = nullptr;
      own.smoothed.clear();
      merge(RadiusRun(own, threads_, search_, wholeRuleSearch_).run());
    }
    else
    {
      const QuerySums sums = density();
      hostPass([&] { forEach(n_, [&](std::int64_t i) { rho[i] = static_cast<float>(sums(i, 0)); }); });
      if (particleDensity)
      {
        particleDensity->resize(static_cast<std::size_t>(n_));
        hostPass([&] { forEach(n_, [&](std::int64_t i) { (*particleDensity)[i] = rho[i]; }); });
      }
    }
    hostPass([&] {
      forEach(n_, [&](std::int64_t i) {
        volumes[i] = (r_.mass ? r_.mass[i] : static_cast<float>(r_.constantMass)) / rho[i];
      });
    });
    return volumes;
  }

  /// The `c` components from `first` of each particle's values, `c` a particle.
  void copyComponents(const SmoothedArray& array, int first, int c, HostBuffer<float>& values)
  {
    values.resize(static_cast<std::size_t>(n_) * c);
    hostPass([&] {
      forEach(n_, [&](std::int64_t i) {
        std::copy_n(array.values + i * array.components + first, c, values.data() + i * c);
      });
    });
  }

  /// One pass's results (components [first, first + c) of an array `width` floats a query wide)
  /// into `out`, and whether each query has a neighbor into `valid`.
  void writePass(const QuerySums& sums, bool gradient, bool shepard, int first, int c, int width, float* out,
    HostBuffer<std::uint8_t>& valid)
  {
    valid.resize(static_cast<std::size_t>(m_));
    hostPass([&] {
      forEach(m_, [&](std::int64_t q) {
        const bool any = sums.any(q);
        valid[q] = any ? 1 : 0;
        float* to = out + q * width;
        if (gradient)
        {
          for (int k = 0; k < 3 * c; ++k)
          {
            to[3 * first + k] = static_cast<float>(sums(q, k));
          }
          return;
        }
        const double weight = sums(q, c);
        const bool null = !any || (shepard && !(weight > 0.0));
        for (int k = 0; k < c; ++k)
        {
          to[first + k] = null ? r_.nullValue : static_cast<float>(shepard ? sums(q, k) / weight : sums(q, k));
        }
      });
    });
  }

  void runArrays()
  {
    const bool gradient = r_.operation == Operation::Gradient;
    const bool shepard = !gradient && r_.normalization == Normalization::Shepard;
    HostBuffer<float> volumes;
    HostBuffer<float> particleDensity;
    if (!shepard)
    {
      volumes = particleVolumes(&particleDensity);
    }
    const bool queryDensityLast = r_.density && !gradient && separate_;
    // Results are formed in scratch and written once every search has run; an array of one pass
    // that is the run's last search writes its output directly.
    std::vector<HostBuffer<float>> results(r_.smoothed.size());
    HostBuffer<float> values;
    bool anyValid = false;
    HostBuffer<std::uint8_t> valid;
    for (std::size_t a = 0; a < r_.smoothed.size(); ++a)
    {
      const SmoothedArray& array = r_.smoothed[a];
      const int width = gradient ? 3 * array.components : array.components;
      const bool direct =
        a + 1 == r_.smoothed.size() && array.components <= maxComponentsPerPass && !queryDensityLast;
      if (!direct)
      {
        results[a].resize(static_cast<std::size_t>(m_) * width);
      }
      for (int first = 0; first < array.components; first += maxComponentsPerPass)
      {
        const int c = std::min(maxComponentsPerPass, array.components - first);
        copyComponents(array, first, c, values);
        const QuerySums sums = runSum(gradient ? RadiusSum::Gradient : RadiusSum::Smoothing,
          shepard ? nullptr : volumes.data(), 1.0f, values.data(), c);
        writePass(sums, gradient, shepard, first, c, width, direct ? array.output : results[a].data(), valid);
        anyValid = true;
      }
    }
    QuerySums queryDensity;
    if (queryDensityLast)
    {
      queryDensity = density();
    }
    // Every search succeeded: the outputs.
    hostPass([&] {
      for (std::size_t a = 0; a < r_.smoothed.size(); ++a)
      {
        const std::size_t width = results[a].size() / std::size_t(std::max<std::int64_t>(1, m_));
        forEach(m_, [&](std::int64_t q) {
          std::copy_n(results[a].data() + q * width, width, r_.smoothed[a].output + q * width);
        });
      }
      if (r_.density)
      {
        forEach(m_, [&](std::int64_t q) {
          r_.density[q] = separate_ ? static_cast<float>(queryDensity(q, 0)) : particleDensity[q];
        });
      }
      if (r_.valid && anyValid)
      {
        forEach(m_, [&](std::int64_t q) { r_.valid[q] = valid[q]; });
      }
    });
  }

  const Request& r_;
  int threads_;
  const RadiusSearch& search_;
  bool separate_;
  bool wholeRuleSearch_; // the backend has one (with the particles as their own queries)
  bool wholeRule_;       // and this run uses it
  Points particles_;
  std::int64_t n_;
  std::int64_t m_;
  std::vector<Level> levels_;
  std::vector<Search> searches_;
  int searchesDone_ = 0;
  Report report_;
};

} // namespace

double largestRadiusOf(const Request& r, int threads)
{
  return r.radii ? checkedRadiusRange(r, threads).largest : r.radius;
}

Report runWithRadii(const Request& request, int threads, const RadiusSearch& search, bool wholeRule)
{
  return RadiusRun(request, threads, search, wholeRule).run();
}

} // namespace detail
} // namespace neighborgrid
