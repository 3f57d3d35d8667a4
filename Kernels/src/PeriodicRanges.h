// Which images of a point lie within R of where results are wanted: one definition for the
// host's image builder (Periodic.cxx) and the CUDA backend's (cuda/PeriodicImages.cu), so both
// make the same images in the same order and give the same results.
#pragma once

#include "Backend.h"

#include <cmath>

namespace neighborgrid
{
namespace detail
{

/// PeriodicImages with the per-axis margins worked out once.
struct ImageRanges
{
  bool axes[3] = { false, false, false };
  double origin[3] = { 0, 0, 0 };
  double lengths[3] = { 1, 1, 1 };
  double lo[3] = { 0, 0, 0 };
  double hi[3] = { 0, 0, 0 };
  // k with w + k L in [lo - margin, hi + margin]: R widened a little (an extra image is only an
  // extra candidate; the pair test decides exactly).
  double margin[3] = { 0, 0, 0 };
  // Points strictly inside (noImageLo, noImageHi) on every axis have no image: most points.
  double noImageLo[3] = { -HUGE_VAL, -HUGE_VAL, -HUGE_VAL };
  double noImageHi[3] = { HUGE_VAL, HUGE_VAL, HUGE_VAL };
};

inline ImageRanges makeImageRanges(const PeriodicImages& b)
{
  ImageRanges r;
  for (int a = 0; a < 3; ++a)
  {
    r.axes[a] = b.axes[a];
    r.origin[a] = b.origin[a];
    r.lengths[a] = b.lengths[a];
    r.lo[a] = b.lo[a];
    r.hi[a] = b.hi[a];
    if (!b.axes[a])
    {
      continue;
    }
    const double L = b.lengths[a];
    const double scale = std::fabs(b.lo[a]) + std::fabs(b.hi[a]) + L;
    r.margin[a] = b.radius * (1.0 + 1e-9) + 1e-12 * scale;
    const double slack = 1e-9 * scale;
    r.noImageLo[a] = std::fmax(b.lo[a] - r.margin[a], b.hi[a] + r.margin[a] - L) + slack;
    r.noImageHi[a] = std::fmin(b.lo[a] - r.margin[a] + L, b.hi[a] + r.margin[a]) - slack;
  }
  return r;
}

/// x wrapped into [origin, origin + length): unchanged when already inside.
NG_HD double wrapCoordinate(double x, double origin, double length)
{
  const double end = origin + length;
  if (x >= origin && x < end)
  {
    return x;
  }
  double w = x - length * floor((x - origin) / length);
  if (w >= end)
  {
    w -= length;
  }
  return w < origin ? origin : w; // rounding at the lower face
}

NG_HD void wrapPoint(const ImageRanges& r, double w[3])
{
  for (int a = 0; a < 3; ++a)
  {
    if (r.axes[a])
    {
      w[a] = wrapCoordinate(w[a], r.origin[a], r.lengths[a]);
    }
  }
}

NG_HD bool needsNoImage(const ImageRanges& r, const double w[3])
{
  return w[0] > r.noImageLo[0] && w[0] < r.noImageHi[0] && w[1] > r.noImageLo[1] && w[1] < r.noImageHi[1] &&
    w[2] > r.noImageLo[2] && w[2] < r.noImageHi[2];
}

/// The shifts k0..k1 along axis a of the images of the wrapped coordinate w (0..0 off the box).
NG_HD void imageRange(const ImageRanges& r, double w, int a, long long& k0, long long& k1)
{
  if (!r.axes[a])
  {
    k0 = k1 = 0;
    return;
  }
  const double L = r.lengths[a];
  k0 = static_cast<long long>(ceil((r.lo[a] - r.margin[a] - w) / L));
  k1 = static_cast<long long>(floor((r.hi[a] + r.margin[a] - w) / L));
}

/// Images of the wrapped point w (itself, k = 0, not counted).
NG_HD long long imageCount(const ImageRanges& r, const double w[3])
{
  if (needsNoImage(r, w))
  {
    return 0;
  }
  long long combos = 1;
  bool self = true;
  for (int a = 0; a < 3; ++a)
  {
    long long k0, k1;
    imageRange(r, w[a], a, k0, k1);
    const long long span = k1 >= k0 ? k1 - k0 + 1 : 0;
    // Capped far beyond any run (the caller reports it); the cap is tested in double, not by a
    // 64-bit division (a slow routine on the GPU, run by nearly every warp of the image count).
    constexpr long long ceiling = 1LL << 40;
    combos = double(combos) * double(span) > double(ceiling) ? ceiling : combos * span;
    self = self && k0 <= 0 && 0 <= k1;
  }
  return combos - (self ? 1 : 0);
}

/// Calls image(x) for each image of the wrapped point w, in the order k_z, k_y, k_x.
template <class Image>
NG_HD void forEachImage(const ImageRanges& r, const double w[3], const Image& image)
{
  if (needsNoImage(r, w))
  {
    return;
  }
  long long k0[3], k1[3];
  for (int a = 0; a < 3; ++a)
  {
    imageRange(r, w[a], a, k0[a], k1[a]);
  }
  for (long long kz = k0[2]; kz <= k1[2]; ++kz)
  {
    for (long long ky = k0[1]; ky <= k1[1]; ++ky)
    {
      for (long long kx = k0[0]; kx <= k1[0]; ++kx)
      {
        if (kx == 0 && ky == 0 && kz == 0)
        {
          continue;
        }
        const long long k[3] = { kx, ky, kz };
        double x[3];
        for (int a = 0; a < 3; ++a)
        {
          x[a] = k[a] == 0 ? w[a] : w[a] + double(k[a]) * r.lengths[a];
        }
        image(x);
      }
    }
  }
}

} // namespace detail
} // namespace neighborgrid
