// Threads for the CPU-side work: the CPU backend and the engine's coordinate preparation.
#pragma once

#include "Backend.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <thread>
#include <vector>

namespace neighborgrid
{
namespace detail
{

/// Runs body(begin, end) over [0, count) in slices on `threads` threads; the calling thread
/// works too and is the only one that reports progress (the callback need not be thread-safe).
template <class Body>
void parallelFor(int threads, std::int64_t count, std::int64_t grain, const ProgressReporter* progress,
  double progressFrom, double progressTo, const char* stage, const Body& body)
{
  std::atomic<std::int64_t> next{ 0 };
  std::atomic<std::int64_t> done{ 0 };
  std::atomic<bool> stop{ false };
  auto work = [&](bool reporting) {
    double lastReported = -1.0;
    for (;;)
    {
      const std::int64_t begin = next.fetch_add(grain);
      if (begin >= count || stop.load(std::memory_order_relaxed))
      {
        return;
      }
      const std::int64_t end = std::min(count, begin + grain);
      body(begin, end);
      const std::int64_t finished = done.fetch_add(end - begin) + (end - begin);
      if (reporting && progress)
      {
        const double fraction = double(finished) / double(count);
        if (fraction - lastReported >= 0.01)
        {
          lastReported = fraction;
          (*progress)(progressFrom + (progressTo - progressFrom) * fraction, stage);
        }
      }
    }
  };
  const int helpers =
    static_cast<int>(std::max<std::int64_t>(0, std::min<std::int64_t>(threads, (count + grain - 1) / grain) - 1));
  std::vector<std::thread> pool;
  pool.reserve(helpers);
  for (int t = 0; t < helpers; ++t)
  {
    pool.emplace_back(work, false);
  }
  std::exception_ptr failure;
  try
  {
    work(true);
  }
  catch (...)
  {
    failure = std::current_exception();
    stop = true;
  }
  for (auto& thread : pool)
  {
    thread.join();
  }
  if (failure)
  {
    std::rethrow_exception(failure);
  }
}

/// Runs body(slice, begin, end) on `slices` equal slices of [0, count), one thread each, so that
/// per-slice partial results can be combined in a fixed order afterwards. Trailing slices may be
/// empty (begin == end == count, as 10 items on 7 threads in slices of 2), never past the end.
template <class Body>
void parallelSlices(int slices, std::int64_t count, const Body& body)
{
  slices = static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>(slices, count)));
  const std::int64_t size = (count + slices - 1) / slices;
  std::vector<std::thread> pool;
  std::vector<std::exception_ptr> failures(slices);
  auto run = [&](int slice) {
    try
    {
      body(slice, std::min(count, slice * size), std::min(count, (slice + 1) * size));
    }
    catch (...)
    {
      failures[slice] = std::current_exception();
    }
  };
  for (int t = 1; t < slices; ++t)
  {
    pool.emplace_back(run, t);
  }
  run(0);
  for (auto& thread : pool)
  {
    thread.join();
  }
  for (auto& failure : failures)
  {
    if (failure)
    {
      std::rethrow_exception(failure);
    }
  }
}

/// The sum of n neighbor counts on `threads` threads (a local sum per slice: no shared cache line).
inline std::int64_t parallelSum(int threads, const std::int32_t* counts, std::int64_t n)
{
  const int slices = std::max(1, threads);
  std::vector<std::int64_t> partial(static_cast<std::size_t>(slices), 0);
  parallelSlices(slices, n, [&](int slice, std::int64_t begin, std::int64_t end) {
    std::int64_t sum = 0;
    for (std::int64_t i = begin; i < end; ++i)
    {
      sum += counts[i];
    }
    partial[static_cast<std::size_t>(slice)] = sum;
  });
  std::int64_t total = 0;
  for (std::int64_t sum : partial)
  {
    total += sum;
  }
  return total;
}

} // namespace detail
} // namespace neighborgrid
