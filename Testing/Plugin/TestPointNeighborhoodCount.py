"""Neighbor Count of PointNeighborhood (Backend 'CPU') against a numpy brute force in double.

Conventions (DESIGN.md): j is a neighbor of i when |x_i - x_j| <= R; the count excludes i itself
and includes other points at the same position. Also: every search method, points far from the
origin, an unstructured grid, a composite dataset (each block on its own), and the sample.

    pvpython TestPointNeighborhoodCount.py <NeighborGrid.so> [Data/popc-membrane.vtp]
"""
import sys

import numpy as np
from vtkmodules.util.numpy_support import vtk_to_numpy
from vtkmodules.vtkCommonDataModel import vtkMultiBlockDataSet, vtkUnstructuredGrid
from vtkmodules.vtkIOXML import vtkXMLPolyDataReader

import neighborgrid_testing as T

simple = T.load_plugin(globals())


def brute_force_bounds(xyz, radius):
    """(lo, hi) per point: neighbors strictly inside R(1 - 1e-6) and within R(1 + 1e-6).

    Float coordinates may put a pair at distance ~R on either side of R; such pairs are allowed
    either way, every other pair must be counted exactly.
    """
    lo = np.zeros(len(xyz), dtype=np.int64)
    hi = np.zeros(len(xyz), dtype=np.int64)
    x = np.asarray(xyz, dtype=np.float64)
    r_lo2 = (radius * (1 - 1e-6)) ** 2
    r_hi2 = (radius * (1 + 1e-6)) ** 2
    step = 128
    columns = [np.ascontiguousarray(x[:, c]) for c in range(3)]
    d2 = np.empty((step, len(x)))  # buffers reused across blocks
    tmp = np.empty((step, len(x)))
    for start in range(0, len(x), step):
        m = min(step, len(x) - start)
        d, t = d2[:m], tmp[:m]
        d.fill(0.0)
        for col in columns:
            np.subtract(col[start:start + m, None], col[None, :], out=t)
            np.multiply(t, t, out=t)
            d += t
        d[np.arange(m), np.arange(start, start + m)] = np.inf  # not i itself
        lo[start:start + m] = np.count_nonzero(d < r_lo2, axis=1)
        hi[start:start + m] = np.count_nonzero(d <= r_hi2, axis=1)
    return lo, hi


def check_counts(label, counts, lo, hi):
    if counts is None:
        T.check(False, "%s: no NeighborCount array" % label)
        return
    bad = np.flatnonzero((counts < lo) | (counts > hi))
    exact = np.mean(lo == hi)
    T.check(bad.size == 0, "%s: %d points, %d wrong (mean count %.1f, %.1f%% unambiguous)%s" % (
        label, len(counts), bad.size, counts.mean(), 100 * exact,
        "" if bad.size == 0 else "; first: point %d got %d, expected %d..%d" % (
            bad[0], counts[bad[0]], lo[bad[0]], hi[bad[0]])))


def make_filter(dataobject, radius, method="Auto"):
    f = PointNeighborhood(Input=T.producer(simple, dataobject))  # noqa: F821 (LoadPlugin)
    f.Operation = "Neighbor Count"
    f.Backend = "CPU"
    f.Method = method
    f.Radius = radius
    return f


def run_count(dataobject, radius, method="Auto"):
    f = make_filter(dataobject, radius, method)
    out = T.output_of(f)
    arr = out.GetPointData().GetArray("NeighborCount")
    simple.Delete(f)
    if arr is None:
        return None
    T.check(arr.GetDataTypeAsString() == "int" and arr.GetDataTypeSize() == 4,
            "NeighborCount is int32")
    return vtk_to_numpy(arr).astype(np.int64)


rng = np.random.default_rng(11)
xyz = T.clustered_points(3000, seed=11)
# Coincident points: 40 exact copies of existing points, and one point repeated 5 times.
copies = xyz[rng.choice(len(xyz), 40, replace=False)]
xyz = np.concatenate([xyz, copies, np.repeat(xyz[:1], 4, axis=0)])
xyz = xyz.astype(np.float32).astype(np.float64)  # the cloud as the filter sees it
radius = 0.8
lo, hi = brute_force_bounds(xyz, radius)
poly = T.make_polydata(xyz)

for method in ("Auto", "Counting Sort", "Brute Force"):
    check_counts("clustered cloud with duplicates, %s" % method, run_count(poly, radius, method), lo, hi)

counts = run_count(poly, radius)
if counts is not None:
    T.check(counts[0] >= 4 and lo[0] >= 4, "a point repeated 5 times counts its 4 copies")

# A memory limit below what one run needs: the cloud runs in slabs with halos, same counts, and
# the densities of one run (float sums in another order).
f = make_filter(poly, radius)
f.MemoryLimit = 0.1  # MiB; the CPU search takes about 100 bytes per point, 0.3 MiB here
out = T.output_of(f)
info = T.info_string(out)
slabs = [int(line.split("=")[1]) for line in info.splitlines() if line.startswith("slabs=")]
T.check(slabs and slabs[0] >= 2, "MemoryLimit 0.1 MiB: the run was cut into slabs (%s)" % slabs)
sliced = T.point_array(out, "NeighborCount")
check_counts("in slabs (MemoryLimit 0.1 MiB)", None if sliced is None else vtk_to_numpy(sliced).astype(np.int64),
             lo, hi)


def density_of(proxy):
    arr = T.point_array(T.output_of(proxy), "Density")
    return None if arr is None else vtk_to_numpy(arr).astype(np.float64)


f.Operation = "Density"
sliced_density = density_of(f)
f.MemoryLimit = 0.0
whole_density = density_of(f)
T.check(sliced_density is not None and whole_density is not None and
        T.max_relative_error(sliced_density, whole_density) < 1e-5,
        "density in slabs equals density in one run")
errors = T.ErrorCatcher(f)
f.MemoryLimit = 0.001  # 1 KiB: no slab fits
T.check(density_of(f) is None and "raise the memory limit" in errors.text().lower(),
        "a memory limit too small for any slab is an error that says so: %s" % errors.text()[:300])
simple.Delete(f)

# Far from the origin: double coordinates around (-3e6, 4e6, 1e6); same counts as at the origin.
far = T.make_polydata(xyz + np.array([-3.0e6, 4.0e6, 1.0e6]), double=True)
check_counts("shifted by (-3e6, 4e6, 1e6), double coordinates", run_count(far, radius), lo, hi)

# Radius larger than the cloud: every point sees every other point.
whole = run_count(poly, 1.0e3)
T.check(whole is not None and np.all(whole == len(xyz) - 1), "R larger than the cloud: N - 1 each")

# An unstructured grid (any vtkPointSet) with the same points.
grid = vtkUnstructuredGrid()
grid.SetPoints(poly.GetPoints())
check_counts("vtkUnstructuredGrid input", run_count(grid, radius), lo, hi)

# A composite dataset: each block on its own (neighbors never cross blocks).
blocks = vtkMultiBlockDataSet()
half = len(xyz) // 2
parts = [xyz[:half], xyz[half:]]
for i, part in enumerate(parts):
    blocks.SetBlock(i, T.make_polydata(part))
f = make_filter(blocks, radius)
out = T.output_of(f)
T.check(out.IsA("vtkMultiBlockDataSet") and out.GetNumberOfBlocks() == 2,
        "composite in, composite out with 2 blocks")
for i, part in enumerate(parts):
    block = out.GetBlock(i) if out.IsA("vtkMultiBlockDataSet") else None
    arr = block.GetPointData().GetArray("NeighborCount") if block else None
    blo, bhi = brute_force_bounds(part, radius)
    check_counts("composite block %d" % i, vtk_to_numpy(arr) if arr else None, blo, bhi)
simple.Delete(f)

# The sample data set (32,512 atoms) at the default radius.
if len(sys.argv) > 2:
    reader = vtkXMLPolyDataReader()
    reader.SetFileName(sys.argv[2])
    reader.Update()
    sample = reader.GetOutput()
    sxyz = vtk_to_numpy(sample.GetPoints().GetData()).astype(np.float64)
    slo, shi = brute_force_bounds(sxyz, 5.0)
    check_counts("sample, R = 5", run_count(sample, 5.0), slo, shi)

T.finish()
