#include "Periodic.h"

#include "Backend.h"
#include "PairTest.h"
#include "Radii.h"
#include "PeriodicRanges.h"
#include "Parallel.h"
#include "Slabs.h"
#include "Timer.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <vector>

namespace neighborgrid
{
namespace detail
{
namespace
{

[[noreturn]] void failPeriodic(const std::string& message)
{
  throw Error("NeighborGrid: " + message);
}

// The source with its images runs in slabs where it is large (Slabs.h); this bound only stops a
// radius far beyond the box lengths from asking for an absurd number of images.
constexpr std::int64_t maxPoints = std::int64_t(1) << 34;

void readPoint(const Points& p, std::int64_t i, double x[3])
{
  for (int a = 0; a < 3; ++a)
  {
    x[a] = coordinateOf(p, i, a);
  }
}

/// Points wrapped into the box along its periodic axes, in double.
std::vector<double> wrapped(const Request& r, const Points& p, int threads)
{
  std::vector<double> out(static_cast<std::size_t>(3 * p.count));
  parallelSlices(threads, p.count, [&](int, std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i)
    {
      double x[3];
      readPoint(p, i, x);
      for (int a = 0; a < 3; ++a)
      {
        out[3 * i + a] = r.periodic[a] ? wrapIntoBox(x[a], r.boxOrigin[a], r.boxLengths[a]) : x[a];
      }
    }
  });
  return out;
}

/// The source with its images: the wrapped points first (input order), then every image
/// w_j + k L within R of [lo, hi] on the periodic axes, and for each image its point.
struct ImageSource
{
  std::vector<double>& xyz;
  std::vector<std::int64_t>& original; // per image
  std::int64_t points = 0;             // the wrapped points before the images
  std::int64_t images = 0;
  std::int64_t total() const { return points + images; }
};

/// Wraps `input` into the box and appends its images within R of [lo, hi], into the caller's
/// (reused) vectors: fresh host memory costs a page fault per 4 KB, which dominated this step.
ImageSource withImages(const Request& r, const Points& input, const double lo[3], const double hi[3], int threads,
  std::vector<double>& xyz, std::vector<std::int64_t>& original)
{
  ImageSource s{ xyz, original };
  s.points = input.count;
  const std::int64_t n = s.points;
  const ImageRanges ranges = makeImageRanges(periodicImagesOf(r, lo, hi));
  auto wrappedPoint = [&](std::int64_t i, double w[3]) {
    readPoint(input, i, w);
    wrapPoint(ranges, w);
  };
  const int slices = static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>(threads, n)));
  std::vector<std::int64_t> perSlice(slices, 0);
  parallelSlices(slices, n, [&](int slice, std::int64_t begin, std::int64_t end) {
    std::int64_t count = 0;
    for (std::int64_t j = begin; j < end; ++j)
    {
      double w[3];
      wrappedPoint(j, w);
      count = std::min<std::int64_t>(maxPoints, count + imageCount(ranges, w));
    }
    perSlice[slice] = count;
  });
  std::int64_t images = 0;
  for (std::int64_t& c : perSlice)
  {
    const std::int64_t first = images;
    images += c;
    c = first;
  }
  if (n + images > maxPoints)
  {
    std::ostringstream m;
    m << "the periodic images within R of the box (or of the query grid) would bring the source to more than "
         "2^34 points (" << n << " points and at least " << images << " images); R is large against the box "
      << "lengths, or the query grid reaches far outside the box";
    failPeriodic(m.str());
  }
  s.images = images;
  if (xyz.size() < static_cast<std::size_t>(3 * (n + images)))
  {
    xyz.resize(static_cast<std::size_t>(3 * (n + images)));
  }
  if (original.size() < static_cast<std::size_t>(images))
  {
    original.resize(static_cast<std::size_t>(images));
  }
  parallelSlices(slices, n, [&](int slice, std::int64_t begin, std::int64_t end) {
    std::int64_t next = n + perSlice[slice];
    for (std::int64_t j = begin; j < end; ++j)
    {
      double w[3];
      wrappedPoint(j, w);
      std::copy(w, w + 3, xyz.begin() + 3 * j);
      forEachImage(ranges, w, [&](const double x[3]) {
        std::copy(x, x + 3, xyz.begin() + 3 * next);
        original[next - n] = j;
        ++next;
      });
    }
  });
  return s;
}

/// values (per point, `components` each) extended to the images.
std::vector<float> extended(const float* values, int components, const ImageSource& s)
{
  const std::size_t c = static_cast<std::size_t>(components);
  std::vector<float> out(static_cast<std::size_t>(s.total()) * c);
  std::copy(values, values + static_cast<std::size_t>(s.points) * c, out.begin());
  for (std::size_t m = 0; m < static_cast<std::size_t>(s.images); ++m)
  {
    const float* from = values + static_cast<std::size_t>(s.original[m]) * c;
    std::copy(from, from + c, out.begin() + (static_cast<std::size_t>(s.points) + m) * c);
  }
  return out;
}

void mergeStages(Report& into, const Report& from, const std::string& prefix)
{
  for (const StageTime& t : from.stages)
  {
    into.stages.push_back({ prefix + t.stage, t.milliseconds });
  }
  into.pairsDecidedInDouble += from.pairsDecidedInDouble;
}

/// The particles' density rho_j, periodic, at the points of `particles`.
std::vector<float> particleDensity(const Request& r, const Points& particles, int threads, const OpenRun& openRun,
  Report& report)
{
  Request d = r;
  d.points = particles;
  d.source = Points();
  d.queryGrid = QueryGrid();
  d.valid = nullptr;
  d.operation = Operation::Density;
  d.smoothed.clear();
  d.neighborCount = nullptr;
  std::vector<float> rho(static_cast<std::size_t>(particles.count));
  d.density = rho.data();
  PeriodicScratch own; // the caller's scratch holds the run this density feeds
  const Report first = runPeriodic(d, threads, openRun, own);
  mergeStages(report, first, "density: ");
  return rho;
}

/// The open-box request that runs `r` on `source`: same operation and outputs, no periodic axis,
/// the particles (and their images) as the points; the caller sets queries and outputs.
Request openRequest(const Request& r, const ImageSource& source)
{
  Request d = r;
  for (int a = 0; a < 3; ++a)
  {
    d.periodic[a] = false;
  }
  d.points = Points(source.xyz.data(), source.total());
  d.source = Points();
  return d;
}

/// Masses, particle volumes and arrays to smooth extended to the images, and installed in `d`.
struct ExtendedInputs
{
  std::vector<float> masses, volumes, radii;
  std::vector<std::vector<float>> values;

  ExtendedInputs(Request& d, const ImageSource& source)
  {
    if (d.radii)
    {
      radii = extended(d.radii, 1, source);
      d.radii = radii.data();
    }
    if (d.mass)
    {
      masses = extended(d.mass, 1, source);
      d.mass = masses.data();
    }
    if (d.particleVolumes)
    {
      volumes = extended(d.particleVolumes, 1, source);
      d.particleVolumes = volumes.data();
    }
    values.reserve(d.smoothed.size());
    for (SmoothedArray& array : d.smoothed)
    {
      values.push_back(extended(array.values, array.components, source));
      array.values = values.back().data();
    }
  }
};

/// SPH weights m_j / rho_j for every source point and image, from the particles' periodic
/// density (an image takes its particle's rho: near the outer edge of the images, its own
/// neighborhood is cut off).
std::vector<float> sphWeights(const Request& r, const std::vector<float>& rho, const ImageSource& source)
{
  const std::int64_t n = source.points;
  std::vector<float> weights(static_cast<std::size_t>(source.total()));
  const float constant = static_cast<float>(r.constantMass);
  for (std::int64_t j = 0; j < source.total(); ++j)
  {
    const std::int64_t k = j < n ? j : source.original[static_cast<std::size_t>(j - n)];
    weights[static_cast<std::size_t>(j)] = (r.mass ? r.mass[k] : constant) / rho[static_cast<std::size_t>(k)];
  }
  return weights;
}

/// The last run's report, after the stages of the earlier ones, with the images counted.
Report withStages(const Report& earlier, const Report& last, const ImageSource& source)
{
  Report merged = last;
  merged.stages = earlier.stages;
  merged.pairsDecidedInDouble = earlier.pairsDecidedInDouble;
  mergeStages(merged, last, "");
  merged.periodicImages = source.images;
  return merged;
}

/// Particles that are their own queries: the open engine runs on the wrapped particles and their
/// images as one particle set, so every method searches in its own cell order (CLAWS with its
/// symmetric pass). Results for the images are computed and dropped: about images / points more
/// search work.
Report runParticlesWithImages(const Request& r, const ImageSource& source, const OpenRun& openRun, Report report)
{
  const std::int64_t n = source.points;
  const std::size_t total = static_cast<std::size_t>(source.total());
  Request d = openRequest(r, source);
  ExtendedInputs inputs(d, source);
  // Outputs for every point of the run, images included; the first n are the particles'.
  std::vector<std::int32_t> counts;
  std::vector<float> density;
  std::vector<std::vector<float>> outputs;
  if (r.neighborCount)
  {
    counts.resize(total);
    d.neighborCount = counts.data();
  }
  if (r.density)
  {
    density.resize(total);
    d.density = density.data();
  }
  // The gradient writes 3 values per component (d/dx, d/dy, d/dz).
  const int perComponent = r.operation == Operation::Gradient ? 3 : 1;
  outputs.reserve(d.smoothed.size());
  for (SmoothedArray& array : d.smoothed)
  {
    outputs.emplace_back(total * static_cast<std::size_t>(array.components * perComponent));
    array.output = outputs.back().data();
  }

  // SPH smoothing and the gradient weigh by m_j / rho_j: an image takes its particle's rho (near
  // the outer edge of the images its own neighborhood is cut off).
  std::vector<float> weights;
  const bool weighs = r.operation == Operation::Gradient ||
    (r.operation == Operation::Smoothing && r.normalization == Normalization::SPH);
  if (weighs && !r.particleVolumes)
  {
    Request densityRun = d;
    densityRun.operation = Operation::Density;
    densityRun.smoothed.clear();
    std::vector<float> rho(total);
    densityRun.density = rho.data();
    mergeStages(report, openRun(densityRun), "density: ");
    if (r.density)
    {
      std::copy(rho.begin(), rho.begin() + n, r.density);
    }
    weights = sphWeights(r, rho, source);
    d.particleVolumes = weights.data();
    d.density = nullptr;
  }

  Report merged = withStages(report, openRun(d), source);
  if (r.neighborCount)
  {
    std::copy(counts.begin(), counts.begin() + n, r.neighborCount);
    merged.neighborPairs = 0;
    for (std::int64_t i = 0; i < n; ++i)
    {
      merged.neighborPairs += r.neighborCount[i];
    }
  }
  if (d.density)
  {
    std::copy(density.begin(), density.begin() + n, r.density);
  }
  for (std::size_t a = 0; a < outputs.size(); ++a)
  {
    std::copy(outputs[a].begin(), outputs[a].begin() + n * r.smoothed[a].components * perComponent,
      r.smoothed[a].output);
  }
  return merged;
}

/// Particles with far more images than themselves: their results as a probe of the particles at
/// their own positions (queries over the particles and their images), each point's count less
/// the point itself (at distance 0, always within R). Density and smoothing count the point, as
/// a particle's do.
Report runParticlesAsQueries(const Request& r, int threads, const OpenRun& openRun, PeriodicScratch& scratch)
{
  Request probe = r;
  probe.source = r.points;
  probe.valid = nullptr;
  Report report = runPeriodic(probe, threads, openRun, scratch);
  if (r.neighborCount)
  {
    const std::int64_t n = r.points.count;
    parallelSlices(threads, n, [&](int, std::int64_t begin, std::int64_t end) {
      for (std::int64_t i = begin; i < end; ++i)
      {
        --r.neighborCount[i];
      }
    });
    report.neighborPairs = parallelSum(threads, r.neighborCount, n);
  }
  return report;
}

} // namespace

bool isPeriodic(const Request& r)
{
  return r.periodic[0] || r.periodic[1] || r.periodic[2];
}

void validatePeriodicBox(const Request& r)
{
  for (int a = 0; a < 3; ++a)
  {
    if (!r.periodic[a])
    {
      continue;
    }
    if (!(std::isfinite(r.boxLengths[a]) && r.boxLengths[a] > 0.0) || !std::isfinite(r.boxOrigin[a]))
    {
      std::ostringstream m;
      m << "axis " << "xyz"[a] << " is periodic, so its box needs a finite origin and a length > 0 (got origin "
        << r.boxOrigin[a] << ", length " << r.boxLengths[a] << ")";
      failPeriodic(m.str());
    }
  }
}

double wrapIntoBox(double x, double origin, double length)
{
  return wrapCoordinate(x, origin, length);
}

PeriodicImages periodicImagesOf(const Request& r, const double lo[3], const double hi[3])
{
  PeriodicImages box;
  for (int a = 0; a < 3; ++a)
  {
    box.axes[a] = r.periodic[a];
    box.origin[a] = r.boxOrigin[a];
    box.lengths[a] = r.periodic[a] ? r.boxLengths[a] : 1.0;
    box.lo[a] = lo[a];
    box.hi[a] = hi[a];
  }
  box.radius = r.radius;
  return box;
}

double expectedImagesPerParticle(const Request& r)
{
  double copies = 1.0;
  for (int a = 0; a < 3; ++a)
  {
    if (r.periodic[a])
    {
      copies *= 1.0 + 2.0 * r.radius / r.boxLengths[a];
    }
  }
  return copies - 1.0;
}

PeriodicImages periodicBoxOfParticles(const Request& r)
{
  double lo[3], hi[3];
  for (int a = 0; a < 3; ++a)
  {
    lo[a] = r.boxOrigin[a];
    hi[a] = r.boxOrigin[a] + r.boxLengths[a];
  }
  return periodicImagesOf(r, lo, hi);
}

std::int64_t wrappedWithImages(const Request& r, double radius, int threads, PeriodicScratch& scratch)
{
  Request atRadius = r;
  atRadius.radius = radius;
  double lo[3], hi[3];
  for (int a = 0; a < 3; ++a)
  {
    lo[a] = r.boxOrigin[a];
    hi[a] = r.boxOrigin[a] + r.boxLengths[a];
  }
  return withImages(atRadius, r.points, lo, hi, threads, scratch.source, scratch.original).total();
}

Report runPeriodicWithRadii(const Request& r, int threads, const OpenRun& radiusRun, PeriodicScratch& scratch)
{
  Request imaging = r;
  imaging.radius = largestRadiusOf(r, threads); // the images every pair within a radius needs
  return runPeriodic(imaging, threads, radiusRun, scratch);
}

Report runPeriodic(const Request& r, int threads, const OpenRun& openRun, PeriodicScratch& scratch)
{
  const bool separate = hasSeparateSource(r);
  // As queries over the images a particle has neither its own radius (Gather, Symmetric) nor its
  // own value (the gradient's f_i): the radius layer runs on particles and images together.
  const bool radiusLayer = r.radii || r.operation == Operation::Gradient;
  if (!separate && !radiusLayer && expectedImagesPerParticle(r) > imagesPerParticleForQueries)
  {
    return runParticlesAsQueries(r, threads, openRun, scratch);
  }
  Timer timer;
  const Points& particles = separate ? r.source : r.points;

  // Where results are wanted: the box, or a grid's bounds where the grid is not wrapped.
  double lo[3], hi[3];
  for (int a = 0; a < 3; ++a)
  {
    lo[a] = r.boxOrigin[a];
    hi[a] = r.boxOrigin[a] + r.boxLengths[a];
  }
  std::vector<double> queries; // wrapped query points (a probe, or a grid too far out)
  QueryGrid grid = r.queryGrid;
  if (separate && !grid.empty())
  {
    bool keepGrid = true;
    for (int a = 0; a < 3; ++a)
    {
      const double first = gridCoordinate(grid.origin[a], grid.firstIndex[a], grid.spacing[a]);
      const double last = gridCoordinate(grid.origin[a], grid.firstIndex[a] + grid.dimensions[a] - 1, grid.spacing[a]);
      if (r.periodic[a])
      {
        lo[a] = std::min(first, last);
        hi[a] = std::max(first, last);
        // A grid within a box length of the box keeps its generated points; beyond that the
        // images would outnumber the points, and the grid's points are wrapped instead.
        keepGrid = keepGrid && lo[a] >= r.boxOrigin[a] - r.boxLengths[a] &&
          hi[a] <= r.boxOrigin[a] + 2.0 * r.boxLengths[a];
      }
    }
    if (!keepGrid)
    {
      const std::int64_t m = grid.count();
      queries.resize(static_cast<std::size_t>(3 * m));
      parallelSlices(threads, m, [&](int, std::int64_t begin, std::int64_t end) {
        for (std::int64_t q = begin; q < end; ++q)
        {
          const std::int64_t ijk[3] = { q % grid.dimensions[0], (q / grid.dimensions[0]) % grid.dimensions[1],
            q / (grid.dimensions[0] * grid.dimensions[1]) };
          for (int a = 0; a < 3; ++a)
          {
            const double x = gridCoordinate(grid.origin[a], grid.firstIndex[a] + ijk[a], grid.spacing[a]);
            queries[3 * q + a] = r.periodic[a] ? wrapIntoBox(x, r.boxOrigin[a], r.boxLengths[a]) : x;
          }
        }
      });
      grid = QueryGrid();
      for (int a = 0; a < 3; ++a)
      {
        lo[a] = r.boxOrigin[a];
        hi[a] = r.boxOrigin[a] + r.boxLengths[a];
      }
    }
  }
  else if (separate)
  {
    queries = wrapped(r, r.points, threads);
  }

  const ImageSource source = withImages(r, particles, lo, hi, threads, scratch.source, scratch.original);
  Report report;
  addStage(report, "periodic images", timer.milliseconds());
  if (!separate)
  {
    return runParticlesWithImages(r, source, openRun, report);
  }

  // Probe points or a grid as queries, the particles and their images as the source.
  Request d = openRequest(r, source);
  d.source = Points(source.xyz.data(), source.total());
  if (!queries.empty())
  {
    d.points = Points(queries.data(), static_cast<std::int64_t>(queries.size() / 3));
    d.queryGrid = QueryGrid();
  }
  else
  {
    d.points = Points();
    d.queryGrid = grid;
  }
  ExtendedInputs inputs(d, source);
  std::vector<float> weights;
  if (r.operation == Operation::Smoothing && r.normalization == Normalization::SPH && !r.particleVolumes)
  {
    const std::vector<float> rho = particleDensity(r, r.source, threads, openRun, report);
    if (r.density)
    {
      Request queryDensity = d;
      queryDensity.operation = Operation::Density;
      queryDensity.smoothed.clear();
      mergeStages(report, openRun(queryDensity), "query density: ");
    }
    weights = sphWeights(r, rho, source);
    d.particleVolumes = weights.data();
    d.density = nullptr;
  }
  return withStages(report, openRun(d), source);
}

} // namespace detail
} // namespace neighborgrid
