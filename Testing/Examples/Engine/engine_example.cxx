// The smallest use of the NeighborGrid engine, no VTK: SPH density of a random cloud.
#include <NeighborGrid/NeighborGrid.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

int main()
{
  const std::int64_t count = 100000;
  std::vector<float> xyz(3 * count);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> box(0.0f, 20.0f);
  for (auto& v : xyz)
  {
    v = box(rng);
  }

  neighborgrid::Request request;
  request.points = neighborgrid::Points(xyz.data(), count);
  request.radius = 1.0;
  request.operation = neighborgrid::Operation::Density;
  request.kernel = neighborgrid::Kernel::CubicSpline;
  std::vector<float> density(count);
  request.density = density.data();

  neighborgrid::Engine engine;
  try
  {
    const neighborgrid::Report report = engine.run(request);
    std::printf("backend %s (%s), method %s, device %s\n", neighborgrid::toString(report.backend),
      report.backendReason.c_str(), neighborgrid::toString(report.method), report.device.c_str());
    for (const auto& stage : report.stages)
    {
      std::printf("  %-16s %8.3f ms\n", stage.stage.c_str(), stage.milliseconds);
    }
  }
  catch (const neighborgrid::Error& e)
  {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  // Away from the boundary the estimate is the number density, 100000 / 20^3 = 12.5, plus the
  // point's own contribution W(0) (the sum includes j = i).
  double sum = 0;
  std::int64_t interior = 0;
  for (std::int64_t i = 0; i < count; ++i)
  {
    const float* p = &xyz[3 * i];
    if (std::min({ p[0], p[1], p[2] }) > 1.0f && std::max({ p[0], p[1], p[2] }) < 19.0f)
    {
      sum += density[i];
      ++interior;
    }
  }
  const double mean = sum / double(interior);
  const double expected = 12.5 + neighborgrid::kernelValue(neighborgrid::Kernel::CubicSpline, 3, 1.0, 0.0);
  std::printf("mean interior density %.3f, expected about %.3f\n", mean, expected);
  return std::abs(mean - expected) < 0.02 * expected ? 0 : 1;
}
