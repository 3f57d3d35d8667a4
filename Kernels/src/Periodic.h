// Periodic boxes (Request::periodic) on top of every backend and method: the particles are
// wrapped into the box, their images within R of where results are wanted join them as extra
// points, and the open-box engine runs on particles and images as one particle set (results for
// the images are dropped), or with the probe as queries and particles and images as the source.
// Nothing in the kernels knows about the box, so every method, kernel and operation is periodic
// the same way, and the pair decisions stay exact (double in the rounding band).
#pragma once

#include "Backend.h"
#include "NeighborGrid/NeighborGrid.h"

#include <cstdint>
#include <functional>
#include <vector>

namespace neighborgrid
{
namespace detail
{

using OpenRun = std::function<Report(const Request&)>;

bool isPeriodic(const Request& request);

/// Throws Error for a bad box: a periodic axis whose length is not finite and > 0, or whose
/// origin is not finite.
void validatePeriodicBox(const Request& request);

/// x wrapped into [origin, origin + length): unchanged when already inside.
double wrapIntoBox(double x, double origin, double length);

/// The box of `r` with results wanted within [lo, hi] (the box itself for particles).
PeriodicImages periodicImagesOf(const Request& r, const double lo[3], const double hi[3]);

/// The box of a request whose particles are the queries: images within R of the box.
PeriodicImages periodicBoxOfParticles(const Request& r);

/// About how many images each particle has, from R and the box lengths alone: the product over
/// the periodic axes of (1 + 2R / L), less the particle itself.
double expectedImagesPerParticle(const Request& r);

/// Above this many images per particle (R near or beyond the box lengths), results are computed
/// at the particles only, as queries over the particles and their images, instead of at every
/// image too (whose results are dropped): the work then scales with the pairs.
constexpr double imagesPerParticleForQueries = 2.0;

/// Host memory kept from run to run (the source with its images), so that repeated runs do not
/// fault fresh pages in.
struct PeriodicScratch
{
  std::vector<double> source;
  std::vector<std::int64_t> original;
};

/// The particles of `r` wrapped into its box (first, in input order) and their images within
/// `radius` of the box, into scratch.source (x, y, z in double); returns how many points in all.
std::int64_t wrappedWithImages(const Request& r, double radius, int threads, PeriodicScratch& scratch);

/// A periodic request of the radius layer (per-particle radii, the gradient) through `radiusRun`
/// (the layer on an open box): images within the largest radius, carrying their radii, masses
/// and values; the particles' own results from one run over particles and images, the weights
/// m_j / rho_j of the gradient and SPH smoothing from the particles' periodic density.
Report runPeriodicWithRadii(const Request& request, int threads, const OpenRun& radiusRun, PeriodicScratch& scratch);

/// Runs a validated periodic request through `openRun`, on `threads` host threads for the images.
Report runPeriodic(const Request& request, int threads, const OpenRun& openRun, PeriodicScratch& scratch);

} // namespace detail
} // namespace neighborgrid
