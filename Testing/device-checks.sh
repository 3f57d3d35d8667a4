#!/usr/bin/env bash
# What runs on the GPU machine (DESIGN.md, "Where the work runs"): build here, pack the build with
# ../shared/tools/device-bundle, carry .device-bundle, and run there, for example
#   bash .device-bundle/run bash Testing/device-checks.sh tests sanitize
#   bash .device-bundle/run bash Testing/device-checks.sh bench issue exactness outlier billion
# The device tool carries at most 64 MiB; with the ParaView plugin built (Qt and ParaView's
# libraries) the bundle is about 210 MB. The GPU machine has no ParaView, so leave the plugin out:
# bundle a copy of the tool whose `find` adds  ! -path '*/plugins/*' ! -path '*/dist-packages/*'
# ! -path '*/Testing/GUI/*' ! -name TestPeriodicCheckBoxes  (35-40 MB, every step below runs).
# Steps:
#   tests     ctest -L gpu (the CUDA engine, filter and composite tests)
#   sanitize  compute-sanitizer memcheck and racecheck on GPU tests of every method
#             (NG_SANITIZE_FILTER replaces memcheck's test filter)
#   bench T   NeighborGridBenchmark --table=T (CSV and stage timings), for each table named after it
#   headline  every headline figure (NeighborGridBenchmark --table=headline and
#             NeighborGridFilterBenchmark --headline) beside the committed figures of this GPU
#             (Testing/Benchmarks/headline-H200.csv on an H200, headline-H100.csv otherwise),
#             with the ratio; figures more than 10% slower are marked (compare_headline.py);
#             then the pinned-copy floors (--roofline) and each series' achieved transfer rates
#   profile K Nsight Compute on the 4M density row, one launch of each kernel whose name matches
#             the regular expression K (e.g. 'gridSearch<.*Density'), methods from NG_METHODS
# Logs and CSVs go to $OUT (or out/device when OUT is unset); the last lines printed summarize.
set -uo pipefail
cd "$(dirname "$0")/.."
build=${NEIGHBORGRID_BUILD_DIR:-build}
out=${OUT:-out/device}
mkdir -p "$out"
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
summary=()
# The bundle carries regular files only: restore the libraries' version links (libX.so.0 -> libX.so.0.1.0).
for lib in "$build"/lib/lib*.so.*.*.*; do
  [ -e "$lib" ] || continue
  base=${lib%.*.*}
  [ -e "$base" ] || ln -s "$(basename "$lib")" "$base"
  [ -e "${base%.*}" ] || ln -s "$(basename "$lib")" "${base%.*}"
done
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"

tests=$build/bin/NeighborGridKernelsTests
mode=""
for arg in "$@"; do
  case "$arg" in
    tests|sanitize|bench|profile|headline) mode=$arg ;;
  esac
  case "$mode:$arg" in
    tests:tests)
      # The pvpython GPU test needs ParaView, which the GPU machine lacks.
      ctest --test-dir "$build" -L gpu -LE python --output-on-failure --timeout 240 2>&1 | tee "$out/ctest-gpu.log"
      summary+=("ctest -L gpu: $(grep -E 'tests passed|tests failed' "$out/ctest-gpu.log" | tail -1)")
      ;;
    sanitize:sanitize)
      # Small clouds of every kind and every method; the exactness and outlier tests; FENNS/CLAWS
      # with every idea switched off in turn; the cluster sweep at a fiftieth of its size.
      filter='Clouds/EngineAccuracy.NeighborCount*:Clouds/EngineAccuracy.Density*uniform_4000*:Clouds/EngineAccuracy.Smoothing*outliers_3000*:EngineExactness.*:EngineMethods.*:EngineGrid.Radii*:EngineRadiiPeriodic.*:EngineClusterSweep.*:SmoothingLength.*-EngineMethods.FennsAndClawsCountExactlyInDenseClustersOfASparseBox'
      export NEIGHBORGRID_SWEEP_SCALE=${NEIGHBORGRID_SWEEP_SCALE:-0.02}
      "$sanitizer" --tool memcheck --error-exitcode 1 "$tests" --backend=cuda --gtest_filter="${NG_SANITIZE_FILTER:-$filter}" \
        > "$out/memcheck.log" 2>&1
      summary+=("memcheck: exit $? ($(grep -E 'ERROR SUMMARY' "$out/memcheck.log" | tail -1); $(grep -E '^\[  PASSED|^\[  FAILED' "$out/memcheck.log" | tr '\n' ' '))")
      # racecheck is about 1000x slower than a plain run: the sweep at a two-hundredth of its size
      # (clouds of 1,000-7,000 points, every method) ran clean in under 3 minutes on the H100.
      NEIGHBORGRID_SWEEP_SCALE=${NG_RACECHECK_SWEEP_SCALE:-0.005} \
      "$sanitizer" --tool racecheck --error-exitcode 1 "$tests" --backend=cuda \
        --gtest_filter='EngineMethods.*:Clouds/EngineAccuracy.NeighborCount*stacked*:Clouds/EngineAccuracy.Density*clustered*:EngineClusterSweep.*:SmoothingLength.*-EngineMethods.FennsAndClawsCountExactlyInDenseClustersOfASparseBox' \
        > "$out/racecheck.log" 2>&1
      summary+=("racecheck: exit $? ($(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$out/racecheck.log" | tail -1); $(grep -E '^\[  PASSED|^\[  FAILED' "$out/racecheck.log" | tr '\n' ' '))")
      ;;
    headline:headline)
      "$build/bin/NeighborGridBenchmark" --table=headline --roofline --csv="$out/headline.csv" > /dev/null 2> "$out/headline-stages.txt"
      summary+=("headline engine: exit $?")
      "$build/bin/NeighborGridFilterBenchmark" --headline --runs=21 2>> "$out/headline-stages.txt" | tail -n +2 >> "$out/headline.csv"
      summary+=("headline filter: exit ${PIPESTATUS[0]}")
      committed=Testing/Benchmarks/headline-H100.csv
      if grep -q "H200" "$out/gpu.txt" && [ -f Testing/Benchmarks/headline-H200.csv ]; then
        committed=Testing/Benchmarks/headline-H200.csv
      fi
      echo "committed figures: $committed" | tee "$out/headline.md"
      python3 Testing/Benchmarks/compare_headline.py "$out/headline.csv" "$committed" | tee -a "$out/headline.md"
      # The transfer floors (pinned copies) and each series' achieved transfer rates.
      grep -E '^roofline|transfers \(medians\)' "$out/headline-stages.txt" | tee -a "$out/headline.md"
      ;;
    bench:bench|profile:profile) ;;
    profile:*)
      ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
      "$ncu" --kernel-name-base demangled --kernel-name "regex:$arg" --launch-skip 1 --launch-count 1 \
        --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
        --section SchedulerStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
        "$build/bin/NeighborGridBenchmark" --table=issue --runs=1 --methods="${NG_METHODS:-radix-sort}" \
        > "$out/profile.txt" 2>&1
      summary+=("profile $arg: exit $?")
      grep -E "^  [a-zA-Z_:<>]+.*\(|Duration|Compute \(SM\) Throughput|Memory Throughput|L1/TEX Hit|L2 Hit|Achieved Occupancy|Theoretical Occupancy|Registers Per|Avg. Active Threads|Warp Cycles Per Issued|Issued Ipc|No Eligible|One or More|Avg. Not Predicated" "$out/profile.txt" | head -60
      ;;
    bench:*)
      # One CSV and one stage file for all tables (the device tool brings back at most 8 files).
      "$build/bin/NeighborGridBenchmark" --table="$arg" --csv="$out/bench.tmp" > /dev/null 2>> "$out/bench-stages.txt"
      summary+=("bench $arg: exit $?")
      if [ -f "$out/bench.csv" ]; then tail -n +2 "$out/bench.tmp" >> "$out/bench.csv"; else cat "$out/bench.tmp" > "$out/bench.csv"; fi
      rm -f "$out/bench.tmp"
      ;;
  esac
done
echo "=== summary"
printf '%s\n' "${summary[@]}"
[ -f "$out/bench-stages.txt" ] && grep -v '^note' "$out/bench-stages.txt" | cut -c1-300 | tail -40
exit 0
