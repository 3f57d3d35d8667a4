#pragma once

#include "NeighborGrid/NeighborGrid.h"

#include <chrono>
#include <string>

namespace neighborgrid
{
namespace detail
{

class Timer
{
public:
  double milliseconds() const
  {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_).count();
  }

private:
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

/// Adds to the stage of that name (a stage may run several passes).
inline void addStage(Report& report, const std::string& stage, double milliseconds)
{
  for (auto& s : report.stages)
  {
    if (s.stage == stage)
    {
      s.milliseconds += milliseconds;
      return;
    }
  }
  report.stages.push_back({ stage, milliseconds });
}

} // namespace detail
} // namespace neighborgrid
