// Test point clouds and a double-precision brute-force reference for every operation.
#pragma once

#include "NeighborGrid/NeighborGrid.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace ngtest
{

/// The backend the tests run on (--backend=cpu or --backend=cuda; TestEngine.cxx's main).
extern neighborgrid::Backend backendUnderTest;

struct Cloud
{
  std::string name;
  std::vector<double> xyz; // the coordinates as the caller holds them
  bool asFloat = true;     // hand the engine float (true) or double (false) coordinates
  std::vector<float> xyzFloat;
  std::vector<float> mass;
  std::vector<float> scalar;  // one component, positive
  std::vector<float> vector3; // three components, signed
  std::vector<float> tensor9; // nine components: more than one pass of four
  int dimension = 3;

  std::int64_t size() const { return static_cast<std::int64_t>(xyz.size() / 3); }
  neighborgrid::Points points() const
  {
    return asFloat ? neighborgrid::Points(xyzFloat.data(), size()) : neighborgrid::Points(xyz.data(), size());
  }
  double extent() const
  {
    double e = 0;
    for (int a = 0; a < 3; ++a)
    {
      double lo = 1e300, hi = -1e300;
      for (std::int64_t i = 0; i < size(); ++i)
      {
        lo = std::min(lo, xyz[3 * i + a]);
        hi = std::max(hi, xyz[3 * i + a]);
      }
      e = std::max(e, hi - lo);
    }
    return e;
  }
};

inline void finishCloud(Cloud& c, std::mt19937_64& rng)
{
  const std::int64_t n = c.size();
  if (c.asFloat)
  {
    c.xyzFloat.assign(c.xyz.begin(), c.xyz.end());
    // The reference sees exactly what the engine sees.
    c.xyz.assign(c.xyzFloat.begin(), c.xyzFloat.end());
  }
  std::uniform_real_distribution<double> u(0.5, 1.5), s(-1.0, 1.0);
  c.mass.resize(n);
  c.scalar.resize(n);
  c.vector3.resize(3 * n);
  c.tensor9.resize(9 * n);
  for (std::int64_t i = 0; i < n; ++i)
  {
    c.mass[i] = static_cast<float>(u(rng));
    c.scalar[i] = static_cast<float>(2.0 + std::sin(c.xyz[3 * i]) * std::cos(c.xyz[3 * i + 1]));
    for (int k = 0; k < 3; ++k)
    {
      c.vector3[3 * i + k] = static_cast<float>(s(rng));
    }
    for (int k = 0; k < 9; ++k)
    {
      c.tensor9[9 * i + k] = static_cast<float>(k + s(rng));
    }
  }
}

/// kind: uniform, clustered, duplicates, stacked, planar, far (from the origin), outliers.
inline Cloud makeCloud(const std::string& kind, std::int64_t n, double box, std::uint64_t seed, bool asFloat = true)
{
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, box);
  std::normal_distribution<double> g(0.0, box / 40.0);
  Cloud c;
  c.name = kind + "-" + std::to_string(n) + (asFloat ? "-f32" : "-f64");
  c.asFloat = asFloat;
  c.xyz.resize(3 * n);
  if (kind == "clustered")
  {
    const int clusters = 5;
    std::vector<double> centers(3 * clusters);
    for (auto& v : centers)
    {
      v = u(rng);
    }
    for (std::int64_t i = 0; i < n; ++i)
    {
      // Three quarters in tight clusters, the rest uniform background.
      const bool background = i % 4 == 3;
      const int k = static_cast<int>(i % clusters);
      for (int a = 0; a < 3; ++a)
      {
        c.xyz[3 * i + a] = background ? u(rng) : centers[3 * k + a] + g(rng);
      }
    }
  }
  else if (kind == "duplicates")
  {
    // Every position appears three times.
    for (std::int64_t i = 0; i < n; ++i)
    {
      for (int a = 0; a < 3; ++a)
      {
        c.xyz[3 * i + a] = (i % 3 == 0) ? u(rng) : c.xyz[3 * (i - i % 3) + a];
      }
    }
  }
  else if (kind == "stacked")
  {
    // 40 distinct positions, each holding n / 40 points.
    std::vector<double> positions(3 * 40);
    for (auto& v : positions)
    {
      v = u(rng);
    }
    for (std::int64_t i = 0; i < n; ++i)
    {
      for (int a = 0; a < 3; ++a)
      {
        c.xyz[3 * i + a] = positions[3 * (i % 40) + a];
      }
    }
  }
  else if (kind == "planar")
  {
    c.dimension = 2;
    for (std::int64_t i = 0; i < n; ++i)
    {
      c.xyz[3 * i] = u(rng);
      c.xyz[3 * i + 1] = u(rng);
      c.xyz[3 * i + 2] = 7.25; // a plane off z = 0
    }
  }
  else if (kind == "outliers")
  {
    // A dense cube near the origin plus a few far points: escaped particles, stray returns,
    // sentinel coordinates. Cells of size R across the bounding box would number ~10^40.
    const double huge = asFloat ? 3e38 : 1e300; // near the largest float or double
    const double far[][3] = { { 1e6, 1e6, 1e6 }, { -3.5e9, 2.0, 2.0 }, { 1e30, -1e30, 7.0 }, { -9999.0, -9999.0, -9999.0 },
      { 2.0, huge, 2.0 } };
    const std::int64_t farCount = 5 * 4; // each far position holds 4 points: they see each other
    for (std::int64_t i = 0; i < n; ++i)
    {
      for (int a = 0; a < 3; ++a)
      {
        c.xyz[3 * i + a] = i < farCount ? far[i % 5][a] + (a == 2 && i % 5 == 2 ? 0.1 * (i / 5) : 0.0) : u(rng);
      }
    }
  }
  else if (kind == "far")
  {
    const double offset[3] = { 4.2e6, -1.3e6, 6.0e5 }; // geo-referenced scan coordinates
    for (std::int64_t i = 0; i < n; ++i)
    {
      for (int a = 0; a < 3; ++a)
      {
        c.xyz[3 * i + a] = offset[a] + u(rng);
      }
    }
  }
  else // uniform
  {
    for (auto& v : c.xyz)
    {
      v = u(rng);
    }
  }
  finishCloud(c, rng);
  return c;
}

/// The neighbor test exactly as DESIGN.md defines it (the engine's neighborgrid::withinRadius):
/// (dx*dx + dy*dy) + dz*dz <= R*R in double, each operation rounded on its own.
inline bool within(const double* a, const double* b, double radius)
{
  const double dx = a[0] - b[0], dy = a[1] - b[1], dz = a[2] - b[2];
  return (dx * dx + dy * dy) + dz * dz <= radius * radius;
}

/// Every pair (i, j) with j a neighbor of i (self included), from a double-precision brute force
/// over the caller's coordinates: the exact reference every backend and method must match.
struct Reference
{
  std::int64_t n = 0;
  double radius = 0;
  std::vector<std::int64_t> certain;   // neighbor counts (self excluded)
  std::vector<std::int64_t> pairStart; // CSR over neighbors (self included)
  std::vector<std::int32_t> pairIndex;
  std::vector<double> pairDistance;

  Reference(const Cloud& c, double r) : n(c.size()), radius(r)
  {
    certain.assign(n, 0);
    pairStart.assign(n + 1, 0);
    const double* x = c.xyz.data();
    for (std::int64_t i = 0; i < n; ++i)
    {
      for (std::int64_t j = 0; j < n; ++j)
      {
        if (!within(x + 3 * i, x + 3 * j, r))
        {
          continue;
        }
        const double dx = x[3 * i] - x[3 * j], dy = x[3 * i + 1] - x[3 * j + 1], dz = x[3 * i + 2] - x[3 * j + 2];
        pairIndex.push_back(static_cast<std::int32_t>(j));
        pairDistance.push_back(std::sqrt(dx * dx + dy * dy + dz * dz));
        if (j != i)
        {
          ++certain[i];
        }
      }
      pairStart[i + 1] = static_cast<std::int64_t>(pairIndex.size());
    }
  }

  double averageNeighbors() const
  {
    double total = 0;
    for (auto v : certain)
    {
      total += double(v);
    }
    return total / double(n);
  }

  std::vector<double> density(const Cloud& c, neighborgrid::Kernel k, const float* mass, double constantMass) const
  {
    std::vector<double> rho(n, 0.0);
    for (std::int64_t i = 0; i < n; ++i)
    {
      for (std::int64_t p = pairStart[i]; p < pairStart[i + 1]; ++p)
      {
        const double m = mass ? double(mass[pairIndex[p]]) : constantMass;
        rho[i] += m * neighborgrid::kernelValue(k, c.dimension, radius, std::min(pairDistance[p], radius));
      }
    }
    return rho;
  }

  /// Shepard or SPH smoothing of `components`-component values. With `magnitude`, the same sum
  /// over |f_j|: the scale of the float rounding error, which matters where signed values cancel.
  std::vector<double> smooth(const Cloud& c, neighborgrid::Kernel k, const std::vector<float>& values,
    int components, bool shepard, const float* mass, double constantMass, bool magnitude = false) const
  {
    std::vector<double> rho;
    if (!shepard)
    {
      rho = density(c, k, mass, constantMass);
    }
    std::vector<double> out(n * components, 0.0);
    for (std::int64_t i = 0; i < n; ++i)
    {
      double weight = 0;
      for (std::int64_t p = pairStart[i]; p < pairStart[i + 1]; ++p)
      {
        const std::int64_t j = pairIndex[p];
        const double w = neighborgrid::kernelValue(k, c.dimension, radius, std::min(pairDistance[p], radius));
        const double factor = shepard ? w : w * (mass ? double(mass[j]) : constantMass) / rho[j];
        weight += w;
        for (int comp = 0; comp < components; ++comp)
        {
          const double v = values[j * components + comp];
          out[i * components + comp] += factor * (magnitude ? std::abs(v) : v);
        }
      }
      if (shepard)
      {
        for (int comp = 0; comp < components; ++comp)
        {
          out[i * components + comp] /= weight;
        }
      }
    }
    return out;
  }
};

} // namespace ngtest
