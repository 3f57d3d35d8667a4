// The double-precision brute force of per-particle radii (every smoothing length mode, count,
// density, Shepard and SPH smoothing, the gradient) and a periodic box unrolled into an open one:
// shared by the engine tests and the composition matrix.
#pragma once

#include "Clouds.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace ngtest
{
using neighborgrid::Kernel;
using neighborgrid::SmoothingLengthMode;
using neighborgrid::kernelCutoffFactor;
using neighborgrid::kernelDerivative;
using neighborgrid::kernelValue;
using neighborgrid::withinRadius;

/// Relative error <= 1e-5. Where signed values cancel, relative to `magnitude` (the same sum over
/// |f_j|), the scale of any float summation's rounding error.
inline void expectClose(const std::vector<float>& got, const std::vector<double>& want, const char* what,
  const std::vector<double>* magnitude = nullptr)
{
  ASSERT_EQ(got.size(), want.size());
  int bad = 0;
  double worst = 0;
  for (std::size_t k = 0; k < want.size(); ++k)
  {
    const double denominator = std::max(std::abs(want[k]), magnitude ? (*magnitude)[k] : 0.0);
    const double error = std::abs(double(got[k]) - want[k]) / denominator;
    worst = std::max(worst, std::isnan(error) ? 1e300 : error);
    if (!(error <= 1e-5) && bad++ < 5)
    {
      ADD_FAILURE() << what << " entry " << k << ": got " << got[k] << ", reference " << want[k] << " (relative error "
                    << error << ")";
    }
  }
  EXPECT_EQ(bad, 0) << what << ": worst relative error " << worst;
}

inline bool withinDouble(const double* a, const double* b, double radius)
{
  double p[3] = { a[0], a[1], a[2] }, q[3] = { b[0], b[1], b[2] };
  return withinRadius(p, q, radius);
}

/// The double-precision brute force of one smoothing length mode: queries (the particles
/// themselves, or other points with no radius: Scatter) against the particles of `c`.
struct RadiiReference
{
  const Cloud& c;
  const std::vector<float>& radii;
  SmoothingLengthMode mode;
  std::vector<double> queries; // xyz
  std::vector<float> queryRadii; // empty: separate queries
  std::int64_t m = 0;
  std::vector<std::int64_t> start;
  std::vector<std::int32_t> index;

  /// `ownQueries` >= 0: the queries are the first ownQueries particles only (the others are
  /// neighbors only, as periodic images are).
  RadiiReference(const Cloud& cloud, const std::vector<float>& r, SmoothingLengthMode md,
    const std::vector<double>* separate = nullptr, std::int64_t ownQueries = -1)
    : c(cloud), radii(r), mode(md)
  {
    queries = separate ? *separate : c.xyz;
    if (!separate)
    {
      queryRadii = radii;
    }
    if (!separate && ownQueries >= 0)
    {
      queries.resize(static_cast<std::size_t>(3 * ownQueries));
      queryRadii.resize(static_cast<std::size_t>(ownQueries));
    }
    m = std::int64_t(queries.size() / 3);
    start.assign(m + 1, 0);
    for (std::int64_t q = 0; q < m; ++q)
    {
      for (std::int64_t j = 0; j < c.size(); ++j)
      {
        const double* a = &queries[3 * q];
        const double* b = &c.xyz[3 * j];
        bool taken = false;
        switch (mode)
        {
          case SmoothingLengthMode::Gather:
            taken = withinDouble(a, b, queryRadii[q]);
            break;
          case SmoothingLengthMode::Scatter:
            taken = withinDouble(a, b, radii[j]);
            break;
          case SmoothingLengthMode::Symmetric:
            taken = withinDouble(a, b, queryRadii[q]) || withinDouble(a, b, radii[j]);
            break;
        }
        if (taken)
        {
          index.push_back(static_cast<std::int32_t>(j));
        }
      }
      start[q + 1] = std::int64_t(index.size());
    }
  }

  double distance(std::int64_t q, std::int64_t j, double d[3]) const
  {
    for (int a = 0; a < 3; ++a)
    {
      d[a] = queries[3 * q + a] - c.xyz[3 * j + a];
    }
    return std::sqrt(d[0] * d[0] + d[1] * d[1] + d[2] * d[2]);
  }
  /// W and dW/dr of the pair as the mode forms them.
  void weights(Kernel k, std::int64_t q, std::int64_t j, double r, double& w, double& dw) const
  {
    auto one = [&](double radius, double& wv, double& dv) {
      const double rr = std::min(r, radius);
      wv = kernelValue(k, c.dimension, radius, rr);
      dv = kernelDerivative(k, c.dimension, radius, rr);
    };
    double wq = 0, dq = 0, wj = 0, dj = 0;
    if (mode != SmoothingLengthMode::Scatter)
    {
      one(queryRadii[q], wq, dq);
    }
    if (mode != SmoothingLengthMode::Gather)
    {
      one(radii[j], wj, dj);
    }
    w = mode == SmoothingLengthMode::Gather ? wq : mode == SmoothingLengthMode::Scatter ? wj : 0.5 * (wq + wj);
    dw = mode == SmoothingLengthMode::Gather ? dq : mode == SmoothingLengthMode::Scatter ? dj : 0.5 * (dq + dj);
  }
  /// The radius the pair's kernel is narrowest for (the one its float rounding matters most for).
  double smallestRadius(std::int64_t q, std::int64_t j) const
  {
    return mode == SmoothingLengthMode::Gather ? queryRadii[q]
      : mode == SmoothingLengthMode::Scatter   ? radii[j]
                                               : std::min<double>(queryRadii[q], radii[j]);
  }
  /// W is evaluated in float from q = r / h (and on the GPU r from an approximate reciprocal
  /// square root): near the cutoff its absolute error is about 1e-7 of W(0), not of W itself.
  double valueFloor(Kernel k, std::int64_t q, std::int64_t j) const
  {
    return 1e-2 * kernelValue(k, c.dimension, smallestRadius(q, j), 0.0);
  }
  std::vector<double> counts() const
  {
    std::vector<double> n(m);
    for (std::int64_t q = 0; q < m; ++q)
    {
      n[q] = double(start[q + 1] - start[q]) - (queryRadii.empty() ? 0 : 1);
    }
    return n;
  }
  std::vector<double> density(Kernel k, std::vector<double>* magnitude = nullptr) const
  {
    std::vector<double> rho(m, 0.0);
    if (magnitude)
    {
      magnitude->assign(m, 1e-30);
    }
    for (std::int64_t q = 0; q < m; ++q)
    {
      for (std::int64_t p = start[q]; p < start[q + 1]; ++p)
      {
        double d[3], w, dw;
        const std::int64_t j = index[p];
        weights(k, q, j, distance(q, j, d), w, dw);
        rho[q] += c.mass[j] * w;
        if (magnitude)
        {
          (*magnitude)[q] += c.mass[j] * (w + valueFloor(k, q, j));
        }
      }
    }
    return rho;
  }
  /// Shepard (volumes empty) or SPH (V_j given) smoothing of `components`-component values.
  std::vector<double> smooth(Kernel k, const std::vector<float>& values, int components,
    const std::vector<double>& volumes, std::vector<double>* magnitude) const
  {
    std::vector<double> out(m * components, 0.0);
    magnitude->assign(m * components, 0.0);
    for (std::int64_t q = 0; q < m; ++q)
    {
      double sumW = 0;
      for (std::int64_t p = start[q]; p < start[q + 1]; ++p)
      {
        double d[3], w, dw;
        const std::int64_t j = index[p];
        weights(k, q, j, distance(q, j, d), w, dw);
        const double v = volumes.empty() ? 1.0 : volumes[j];
        sumW += v * w;
        for (int a = 0; a < components; ++a)
        {
          out[q * components + a] += v * w * values[j * components + a];
          (*magnitude)[q * components + a] += std::abs(v * (w + valueFloor(k, q, j)) * values[j * components + a]);
        }
      }
      if (volumes.empty())
      {
        for (int a = 0; a < components; ++a)
        {
          out[q * components + a] /= sumW;
          (*magnitude)[q * components + a] /= sumW;
        }
      }
    }
    return out;
  }
  /// sum_j V_j (f_j - f_q) dW/dr (x_q - x_j) / r: 3 per component.
  std::vector<double> gradient(Kernel k, const std::vector<float>& values, int components,
    const std::vector<double>& volumes, std::vector<double>* magnitude) const
  {
    std::vector<double> out(m * 3 * components, 0.0);
    magnitude->assign(m * 3 * components, 1e-30); // an isolated point's gradient is exactly 0
    for (std::int64_t q = 0; q < m; ++q)
    {
      for (std::int64_t p = start[q]; p < start[q + 1]; ++p)
      {
        double d[3], w, dw;
        const std::int64_t j = index[p];
        const double r = distance(q, j, d);
        if (r == 0.0)
        {
          continue;
        }
        weights(k, q, j, r, w, dw);
        // dW/dr is evaluated in float from q = r / h: near the cutoff its absolute error is a few
        // 1e-7 of the kernel's derivative scale (|dW/dr| at q = 1), not of dW/dr itself.
        const double smallest = smallestRadius(q, j);
        const double derivativeScale =
          std::abs(kernelDerivative(k, c.dimension, smallest, smallest / kernelCutoffFactor(k)));
        for (int a = 0; a < components; ++a)
        {
          const double df = double(values[j * components + a]) - double(values[q * components + a]);
          for (int x = 0; x < 3; ++x)
          {
            const double term = volumes[j] * df * dw * d[x] / r;
            out[(q * components + a) * 3 + x] += term;
            // The float scale: each term and the float differences of values and coordinates.
            (*magnitude)[(q * components + a) * 3 + x] +=
              std::abs(volumes[j]) * (std::abs(dw) + 0.1 * derivativeScale) *
              (std::abs(df) + 1e-7 * (std::abs(values[j * components + a]) + std::abs(values[q * components + a])));
          }
        }
      }
    }
    return out;
  }
};

inline std::vector<double> volumesFrom(const Cloud& c, const std::vector<double>& rho)
{
  std::vector<double> v(rho.size());
  for (std::size_t j = 0; j < rho.size(); ++j)
  {
    v[j] = c.mass[j] / rho[j];
  }
  return v;
}

inline std::vector<double> asDouble(const std::vector<std::int32_t>& v)
{
  return std::vector<double>(v.begin(), v.end());
}

/// A cloud in the periodic box [0, L)^3 and the same cloud with every image in the 26 boxes
/// around it appended (index n + 26 i + s is an image of point i), with masses, values and radii:
/// an open box in which the first n points see what they see in the periodic one, as long as every
/// radius is below L / 2 (so that 2 radii, the reach of a neighbor's own neighbors, stay within
/// the shell of images).
struct UnrolledBox
{
  Cloud particles, unrolled;
  std::vector<float> radii, unrolledRadii;
  std::vector<std::int64_t> original; // per point of `unrolled`
};

/// largestRadius: the radii reach L * (0.03 + largestRadius t^3), t uniform in [0, 1).
inline UnrolledBox unrolledBox(std::int64_t n, double L, std::uint64_t seed, double largestRadius = 0.4)
{
  UnrolledBox b;
  std::mt19937_64 rng(seed);
  Cloud& c = b.particles;
  c.name = "periodic radii";
  c.asFloat = true;
  c.xyz.resize(3 * n);
  std::uniform_real_distribution<double> u(0.0, L);
  std::normal_distribution<double> g(0.0, 0.04 * L);
  const double centers[2][3] = { { 0.05 * L, 0.5 * L, 0.97 * L }, { 0.6 * L, 0.3 * L, 0.5 * L } }; // one on faces
  for (std::int64_t i = 0; i < n; ++i)
  {
    const int kind = static_cast<int>(i % 3); // 0, 1: a cluster, 2: background
    for (int a = 0; a < 3; ++a)
    {
      const double x = kind < 2 ? centers[kind][a] + g(rng) : u(rng);
      c.xyz[3 * i + a] = x - L * std::floor(x / L);
    }
  }
  ngtest::finishCloud(c, rng);
  for (double& x : c.xyz)
  {
    x = std::min(x, std::nextafter(L, 0.0)); // float rounding may land on L
  }
  c.xyzFloat.assign(c.xyz.begin(), c.xyz.end());
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  for (std::int64_t i = 0; i < n; ++i)
  {
    const double t = unit(rng);
    b.radii.push_back(static_cast<float>(L * (0.03 + largestRadius * t * t * t))); // 0.4: up to 0.43 L, < L / 2
  }
  Cloud& e = b.unrolled;
  e = c;
  b.unrolledRadii = b.radii;
  for (std::int64_t i = 0; i < n; ++i)
  {
    b.original.push_back(i);
  }
  for (std::int64_t i = 0; i < n; ++i)
  {
    for (int s = 0; s < 27; ++s)
    {
      const int m[3] = { s % 3 - 1, (s / 3) % 3 - 1, s / 9 - 1 };
      if (m[0] == 0 && m[1] == 0 && m[2] == 0)
      {
        continue;
      }
      for (int a = 0; a < 3; ++a)
      {
        e.xyz.push_back(m[a] == 0 ? c.xyz[3 * i + a] : c.xyz[3 * i + a] + double(m[a]) * L); // the engine's image
      }
      e.mass.push_back(c.mass[i]);
      e.scalar.push_back(c.scalar[i]);
      for (int a = 0; a < 3; ++a)
      {
        e.vector3.push_back(c.vector3[3 * i + a]);
      }
      b.unrolledRadii.push_back(b.radii[i]);
      b.original.push_back(i);
    }
  }
  e.asFloat = false; // images in double, as the engine makes them
  return b;
}

template <class T>
std::vector<T> firstOf(const std::vector<T>& v, std::int64_t count)
{
  return std::vector<T>(v.begin(), v.begin() + count);
}

} // namespace ngtest
