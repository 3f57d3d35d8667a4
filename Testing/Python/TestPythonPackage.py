"""The Python package neighborgrid (NeighborGrid::Filters wrapped) in pvpython and pvbatch.

    pvpython TestPythonPackage.py --package-dir DIR [--plugin NeighborGrid.so] [--prefix DIR]

Without --plugin, `neighborgrid` must be importable already (PYTHONPATH=DIR). With --plugin it
must NOT be importable at first, and must be once LoadPlugin has loaded the plugin (the stub
embedded in NeighborGrid.so). Either way the package must come from DIR/neighborgrid, and with
--prefix every NeighborGrid library in the process must lie under that prefix (the install tree
test: no library may come from the build tree).

Then, on the CPU backend, with numpy in and numpy out:
- vtkPointNeighborhoodFilter, Neighbor Count: equal to a double-precision brute force, exactly.
  DESIGN.md's conventions: j is a neighbor of i when |x_i - x_j| <= R; the point itself does not
  count, other points at the same position do. The cloud has duplicates and lattice pairs at
  exactly R, so a brute force with '<' or one that counts the point itself would differ.
- vtkPointNeighborhoodProbe (a line of probe points) and vtkPointNeighborhoodVolume (a grid): the
  particles within R of every probe or grid point, exactly (a probe point is not a particle).
- A radius that is not a number: the filter reports an error that names the radius (an
  ErrorEvent) and its output is empty; a numpy array instead of a VTK data object: TypeError.
"""
import argparse
import importlib.util
import os
import sys

import numpy as np
from vtkmodules.numpy_interface import dataset_adapter as dsa
from vtkmodules.util.misc import calldata_type
from vtkmodules.util.numpy_support import numpy_to_vtk, vtk_to_numpy
from vtkmodules.vtkCommonCore import VTK_STRING, vtkPoints
from vtkmodules.vtkCommonDataModel import vtkPolyData
from vtkmodules.vtkCommonExecutionModel import vtkAlgorithm

FAILURES = []


def check(condition, message):
    print(("ok   " if condition else "FAIL ") + message)
    if not condition:
        FAILURES.append(message)
    return condition


parser = argparse.ArgumentParser()
parser.add_argument("--package-dir", required=True, help="the folder that must hold neighborgrid/")
parser.add_argument("--plugin", help="load this NeighborGrid.so first; it makes the package importable")
parser.add_argument("--prefix", help="every NeighborGrid library loaded must lie under this folder")
args = parser.parse_args()
package_dir = os.path.realpath(args.package_dir)

# ---------------------------------------------------------------------------------------------
# Where the package comes from
if args.plugin:
    check(importlib.util.find_spec("neighborgrid") is None,
          "neighborgrid is not importable before the plugin is loaded (PYTHONPATH=%r)"
          % os.environ.get("PYTHONPATH"))
    from paraview import simple

    simple.LoadPlugin(args.plugin)

import neighborgrid  # noqa: E402
from neighborgrid import (  # noqa: E402
    vtkPointNeighborhoodFilter,
    vtkPointNeighborhoodProbe,
    vtkPointNeighborhoodVolume,
)

extension = sys.modules["neighborgrid.NeighborGridFilters"].__file__
check(os.path.dirname(os.path.realpath(extension)) == os.path.join(package_dir, "neighborgrid"),
      "the extension module is %s/neighborgrid/NeighborGridFilters* (got %s)" % (package_dir, extension))
check(issubclass(vtkPointNeighborhoodFilter, vtkAlgorithm)
      and issubclass(vtkPointNeighborhoodProbe, vtkPointNeighborhoodFilter)
      and issubclass(vtkPointNeighborhoodVolume, vtkPointNeighborhoodFilter),
      "the classes derive from ParaView's vtkAlgorithm and from vtkPointNeighborhoodFilter")
if args.prefix:
    prefix = os.path.realpath(args.prefix)
    with open("/proc/self/maps") as maps:
        loaded = sorted({line.split()[-1] for line in maps if "NeighborGrid" in line.split()[-1]})
    check(any(path.endswith("NeighborGridFilters.so") for path in loaded)
          and all(os.path.realpath(path).startswith(prefix + os.sep) for path in loaded),
          "every NeighborGrid library loaded lies under %s: %s" % (prefix, loaded))


# ---------------------------------------------------------------------------------------------
# Data: numpy in
def polydata(xyz):
    """vtkPolyData with the points of an (n, 3) numpy array (the filter needs no cells)."""
    points = vtkPoints()
    points.SetData(numpy_to_vtk(np.ascontiguousarray(xyz), deep=True))
    data = vtkPolyData()
    data.SetPoints(points)
    return data


def neighbors_within(queries, particles, radius):
    """Per query, the particles with |q - x| <= R: the filter's test, ((dx dx + dy dy) + dz dz)
    <= R R in double, in blocks of queries to bound the memory."""
    counts = np.empty(len(queries), dtype=np.int64)
    r2 = radius * radius
    for start in range(0, len(queries), 512):
        q = queries[start:start + 512, None, :]
        d = q - particles[None, :, :]
        counts[start:start + 512] = (((d[..., 0] * d[..., 0] + d[..., 1] * d[..., 1])
                                      + d[..., 2] * d[..., 2]) <= r2).sum(axis=1)
    return counts


R = 1.0
rng = np.random.default_rng(24)
uniform = rng.uniform(0.0, 8.0, size=(3000, 3))
lattice = np.stack(np.meshgrid(*[np.arange(5.0)] * 3, indexing="ij"), axis=-1).reshape(-1, 3)
duplicates = uniform[:40].copy()  # 40 points at the same position as another point
xyz = np.concatenate([uniform, lattice, duplicates, lattice[:10]])
particles = polydata(xyz)

expected = neighbors_within(xyz, xyz, R) - 1  # minus the point itself
ties = int((neighbors_within(xyz, xyz, np.nextafter(R, 0.0)) != neighbors_within(xyz, xyz, R)).sum())
check(ties > 0, "the cloud has points with a neighbor at exactly R (%d)" % ties)

# ---------------------------------------------------------------------------------------------
# Neighbor count at the particles
count = vtkPointNeighborhoodFilter()
count.SetInputData(particles)
count.SetOperation(vtkPointNeighborhoodFilter.NEIGHBOR_COUNT)
count.SetRadius(R)
count.SetBackend(vtkPointNeighborhoodFilter.BACKEND_CPU)
count.Update()
output = dsa.WrapDataObject(count.GetOutput())
counts = output.PointData["NeighborCount"]  # numpy out (a VTKArray is an ndarray)
check(isinstance(counts, np.ndarray) and counts.dtype == np.int32 and counts.shape == (len(xyz),),
      "NeighborCount is an int32 numpy array of %d values (got %s %s)"
      % (len(xyz), getattr(counts, "dtype", type(counts)), getattr(counts, "shape", "")))
mismatch = np.flatnonzero(np.asarray(counts) != expected)
check(mismatch.size == 0, "NeighborCount equals the double brute force at all %d points (%d differ%s)"
      % (len(xyz), mismatch.size, "" if mismatch.size == 0 else ", first %d: got %d, expected %d"
         % (mismatch[0], counts[mismatch[0]], expected[mismatch[0]])))
check(particles.GetPointData().GetArray("NeighborCount") is None, "the input has no new array")

# ---------------------------------------------------------------------------------------------
# Probe: a line of points through the cloud, some on lattice points (particles at distance 0)
line = np.column_stack([np.linspace(-1.0, 9.0, 201), np.full(201, 2.0), np.full(201, 3.0)])
probe = vtkPointNeighborhoodProbe()
probe.SetInputData(particles)
probe.SetSourceData(polydata(line))
probe.SetOperation(vtkPointNeighborhoodFilter.NEIGHBOR_COUNT)
probe.SetRadius(R)
probe.SetBackend(vtkPointNeighborhoodFilter.BACKEND_CPU)
probe.Update()
probe_counts = vtk_to_numpy(probe.GetOutput().GetPointData().GetArray("NeighborCount"))
expected_probe = neighbors_within(line, xyz, R)
check(expected_probe.min() == 0 and expected_probe.max() > 0, "the line has points with and without particles")
check(np.array_equal(probe_counts, expected_probe),
      "Probe: NeighborCount on the line equals the brute force (%d of %d differ)"
      % (int((probe_counts != expected_probe).sum()) if probe_counts.shape == expected_probe.shape
         else -1, len(line)))

# ---------------------------------------------------------------------------------------------
# Volume: a 13^3 grid over the particles' bounds padded by R
volume = vtkPointNeighborhoodVolume()
volume.SetInputData(particles)
volume.SetOperation(vtkPointNeighborhoodFilter.NEIGHBOR_COUNT)
volume.SetRadius(R)
volume.SetResolution(12, 12, 12)
volume.SetBackend(vtkPointNeighborhoodFilter.BACKEND_CPU)
volume.Update()
image = volume.GetOutput()
dims = image.GetDimensions()
grid = np.array([image.GetPoint(k) for k in range(image.GetNumberOfPoints())])
volume_counts = vtk_to_numpy(image.GetPointData().GetArray("NeighborCount"))
expected_volume = neighbors_within(grid, xyz, R)
check(tuple(dims) == (13, 13, 13), "Volume: 13 x 13 x 13 points (got %s)" % (dims,))
check(expected_volume.min() == 0 and expected_volume.max() > 0, "the grid has points with and without particles")
check(np.array_equal(volume_counts, expected_volume),
      "Volume: NeighborCount on the grid equals the brute force (%d of %d differ)"
      % (int((volume_counts != expected_volume).sum()) if volume_counts.shape == expected_volume.shape
         else -1, len(grid)))

# ---------------------------------------------------------------------------------------------
# Wrong input: a clear error, an empty output
errors = []


@calldata_type(VTK_STRING)
def on_error(caller, event, message):
    errors.append(message)


bad = vtkPointNeighborhoodFilter()
bad.AddObserver("ErrorEvent", on_error)
bad.SetInputData(particles)
bad.SetOperation(vtkPointNeighborhoodFilter.NEIGHBOR_COUNT)
bad.SetRadius(float("nan"))
bad.SetBackend(vtkPointNeighborhoodFilter.BACKEND_CPU)
print("a NaN radius (the executive's 'returned failure' message that follows is expected):")
bad.Update()
check(any("radius" in message.lower() for message in errors),
      "a NaN radius is reported as an error naming the radius: %r" % errors)
check(bad.GetOutput().GetNumberOfPoints() == 0, "and the output is left empty")
try:
    count.SetInputData(xyz)
    check(False, "SetInputData(numpy array) raises TypeError")
except TypeError as error:
    check(True, "SetInputData(numpy array) raises TypeError: %s" % error)

if FAILURES:
    print("%d check(s) failed" % len(FAILURES))
    sys.exit(1)
print("all checks passed")
