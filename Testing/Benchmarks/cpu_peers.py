"""NeighborGrid's CPU backend beside its CPU peers, on one cloud, in one run (issue 21).

    pvpython --no-mpi cpu_peers.py NeighborGrid.so [--benchmark NeighborGridBenchmark]
                                   [--n N] [--runs K] [--slow-runs K] [--threads T]

NeighborGrid.so is the built plugin (build-pv/lib/paraview-5.11/plugins/NeighborGrid/). The cloud:
N uniform random float32 points (default 1,048,576) in a cube of side 90 (N / 4M)^(1/3), R = 1.5,
about 80 neighbors each (the engine's "scale" and "cpu" tables), unsorted. Each contender runs on
T threads (default 2) and is timed end to end, median of K runs (--slow-runs for the slow ones):

- NeighborGrid, the VTK filter (proxy PointNeighborhood, Backend CPU): Neighbor Count and Density,
  VTK arrays in, VTK array out.
- NeighborGrid, the engine alone (`NeighborGridBenchmark --cpu --table=cpu`), with --benchmark: its
  own cloud of the same kind, coordinates in and results out of plain arrays.
- vtkSPHInterpolator: probe = source = the particles, cubic kernel, SpatialStep = h = R / 2, a mass
  and a density array of ones on the source; its Shepard sum is then our density (DESIGN.md).
  vtkSMPTools on STDThread with T threads (Debian's VTK defaults to Sequential).
- SciPy's cKDTree (Debian's python3-scipy), the tree's construction included: the count from
  query_ball_point(return_length=True, workers=T) - 1; the density from sparse_distance_matrix
  (which SciPy runs on one thread) and a numpy kernel sum.

Prints a Markdown table, the load average before and after, and how far the results agree.
"""
import argparse
import os
import re
import subprocess
import sys
import time

THREADS_DEFAULT = 2
# vtkSMPTools reads these when it starts; set before VTK is imported.
os.environ.setdefault("VTK_SMP_BACKEND_IN_USE", "STDThread")

import numpy as np  # noqa: E402
from scipy.spatial import cKDTree  # noqa: E402
from vtkmodules.util.numpy_support import numpy_to_vtk, vtk_to_numpy  # noqa: E402
from vtkmodules.vtkCommonCore import vtkPoints, vtkSMPTools  # noqa: E402
from vtkmodules.vtkCommonDataModel import vtkPolyData  # noqa: E402
from vtkmodules.vtkFiltersPoints import vtkSPHCubicKernel, vtkSPHInterpolator  # noqa: E402

RADIUS = 1.5
SIGMA_CUBIC_3D = 1.0 / np.pi


def parse():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("plugin", help="the built NeighborGrid.so")
    p.add_argument("--benchmark", help="NeighborGridBenchmark, for the engine's own times")
    p.add_argument("--n", type=int, default=1048576)
    p.add_argument("--runs", type=int, default=7, help="runs of the fast contenders")
    p.add_argument("--slow-runs", type=int, default=3, help="runs of vtkSPHInterpolator and the kd-tree density")
    p.add_argument("--threads", type=int, default=THREADS_DEFAULT)
    return p.parse_args()


def median_time(runs, work):
    """(median seconds, last result) of `runs` calls of work()."""
    times, result = [], None
    for _ in range(runs):
        began = time.perf_counter()
        result = work()
        times.append(time.perf_counter() - began)
    return float(np.median(times)), result


def cubic_w(r, h):
    """W(r, h) of the cubic spline in 3D (DESIGN.md), in double."""
    q = r / h
    return SIGMA_CUBIC_3D / h ** 3 * (0.25 * np.maximum(2.0 - q, 0.0) ** 3 - np.maximum(1.0 - q, 0.0) ** 3)


# --------------------------------------------------------------------------------------------
# Contenders
def neighborgrid_filter(simple, point_neighborhood, poly, operation):
    """A function that runs PointNeighborhood (Backend CPU) on poly and returns its output array."""
    producer = simple.PVTrivialProducer()
    producer.GetClientSideObject().SetOutput(poly)
    f = point_neighborhood(Input=producer)
    f.Operation = operation
    f.Backend = "CPU"
    f.Radius = RADIUS
    f.Kernel = "Cubic Spline"
    f.UpdatePipeline()  # first run outside the timing: proxies, plugin code paths
    algorithm = f.GetClientSideObject()
    name = "NeighborCount" if operation == "Neighbor Count" else "Density"

    def run():
        algorithm.Modified()
        algorithm.Update()
        return vtk_to_numpy(algorithm.GetOutputDataObject(0).GetPointData().GetArray(name))

    return run


def sph_interpolator(poly, n):
    """A function that runs vtkSPHInterpolator with probe = source = poly and returns its Shepard sum."""
    source = vtkPolyData()
    source.ShallowCopy(poly)
    for name in ("mass", "ones"):
        ones = numpy_to_vtk(np.ones(n, dtype=np.float64), deep=True)
        ones.SetName(name)
        source.GetPointData().AddArray(ones)
    kernel = vtkSPHCubicKernel()
    kernel.SetSpatialStep(RADIUS / 2.0)
    kernel.SetDimension(3)
    interpolator = vtkSPHInterpolator()
    interpolator.SetInputData(poly)
    interpolator.SetSourceData(source)
    interpolator.SetKernel(kernel)
    interpolator.SetMassArrayName("mass")
    interpolator.SetDensityArrayName("ones")
    interpolator.SetComputeShepardSum(True)
    interpolator.SetShepardNormalization(False)
    interpolator.SetPassPointArrays(False)

    def run():
        interpolator.Modified()
        interpolator.Update()
        out = interpolator.GetOutput().GetPointData().GetArray(interpolator.GetShepardSumArrayName())
        return vtk_to_numpy(out)

    return run


def kdtree_count(xyz, threads):
    tree = cKDTree(xyz)
    return tree.query_ball_point(xyz, RADIUS, return_length=True, workers=threads) - 1


def kdtree_density(xyz):
    """sum_j W_ij over the pairs within R, unit mass; the pairs include i = j (distance 0)."""
    tree = cKDTree(xyz)
    pairs = tree.sparse_distance_matrix(tree, RADIUS, output_type="ndarray")
    return np.bincount(pairs["i"], weights=cubic_w(pairs["v"], RADIUS / 2.0), minlength=len(xyz))


def engine_benchmark(binary, runs):
    """{operation: median engine end-to-end seconds} from NeighborGridBenchmark --cpu --table=cpu."""
    done = subprocess.run([binary, "--cpu", "--table=cpu", "--runs=%d" % runs], capture_output=True, text=True,
                          check=True)
    times = {}
    for line in done.stderr.splitlines():
        m = re.match(r"1M-(count|density) .*engine end to end ([0-9.]+) ms", line)
        if m:
            times["Neighbor Count" if m.group(1) == "count" else "Density"] = float(m.group(2)) / 1e3
    return times


# --------------------------------------------------------------------------------------------
def main():
    args = parse()
    vtkSMPTools.SetBackend("STDThread")
    vtkSMPTools.Initialize(args.threads)
    from paraview import simple

    simple.LoadPlugin(args.plugin, ns=globals())  # adds PointNeighborhood here
    if args.threads != os.cpu_count():
        print("note: NeighborGrid's CPU backend takes every core (%d); --threads sets VTK's and SciPy's"
              % os.cpu_count())

    n = args.n
    side = 90.0 * (n / 4194304.0) ** (1.0 / 3.0)
    xyz = np.random.default_rng(2026).uniform(0.0, side, (n, 3)).astype(np.float32)
    xyz64 = xyz.astype(np.float64)  # the coordinates every contender sees
    poly = vtkPolyData()
    points = vtkPoints()
    points.SetData(numpy_to_vtk(xyz, deep=True))
    poly.SetPoints(points)
    load_before = os.getloadavg()

    rows, results = [], {}

    def measure(label, operation, runs, work):
        seconds, result = median_time(runs, work)
        rows.append((label, operation, seconds, runs))
        results[(label, operation)] = np.asarray(result, dtype=np.float64)
        print("  %-42s %-15s %8.3f s" % (label, operation, seconds), flush=True)

    print("%d points, side %.2f, R %.1f, %d threads, VTK SMP backend %s" % (
        n, side, RADIUS, args.threads, vtkSMPTools.GetBackend()), flush=True)
    for operation in ("Neighbor Count", "Density"):
        measure("NeighborGrid filter (CPU backend)", operation, args.runs,
                neighborgrid_filter(simple, globals()["PointNeighborhood"], poly, operation))
    if args.benchmark:
        for operation, seconds in engine_benchmark(args.benchmark, args.runs).items():
            label = "NeighborGrid engine alone (1,048,576 points of its own)"
            rows.append((label, operation, seconds, args.runs))
            print("  %-42s %-15s %8.3f s" % (label, operation, seconds), flush=True)
    measure("SciPy cKDTree (query_ball_point)", "Neighbor Count", args.runs, lambda: kdtree_count(xyz64, args.threads))
    measure("SciPy cKDTree (sparse_distance_matrix)", "Density", args.slow_runs, lambda: kdtree_density(xyz64))
    measure("vtkSPHInterpolator (STDThread)", "Density", args.slow_runs, sph_interpolator(poly, n))
    load_after = os.getloadavg()

    ours = "NeighborGrid filter (CPU backend)"
    print()
    print("| contender | operation | median (s) | runs | NeighborGrid filter is faster by |")
    print("|---|---|---|---|---|")
    for label, operation, seconds, runs in rows:
        ratio = seconds / next(t for who, what, t, _ in rows if who == ours and what == operation)
        print("| %s | %s | %.3f | %d | %s |" % (label, operation, seconds, runs,
                                                "" if label.startswith("NeighborGrid") else "%.1fx" % ratio))
    print()
    print("%d points, %d threads; load average (1, 5, 15 min) before %.2f %.2f %.2f, after %.2f %.2f %.2f" % (
        (n, args.threads) + tuple(load_before) + tuple(load_after)))
    counts = results[(ours, "Neighbor Count")]
    differing = int(np.count_nonzero(counts != results[("SciPy cKDTree (query_ball_point)", "Neighbor Count")]))
    print("counts: mean %.2f neighbors; %d points differ from cKDTree's" % (counts.mean(), differing))
    density = results[(ours, "Density")]
    for label in ("SciPy cKDTree (sparse_distance_matrix)", "vtkSPHInterpolator (STDThread)"):
        other = results[(label, "Density")]
        print("density: max relative difference from %s %.2e" % (label, np.max(np.abs(density - other) / other)))


if __name__ == "__main__":
    sys.exit(main())
