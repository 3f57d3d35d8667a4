"""Density of PointNeighborhood (Backend 'CPU') against VTK's vtkSPHInterpolator.

DESIGN.md: vtkSPHInterpolator with probe = source = the particles, SpatialStep = h = R / cutoff,
a mass array and a density array of ones on the source gives sum_j m_j W_ij as its
"Shepard Summation" array, which must equal our Density to 1e-5 relative, for every kernel.

    pvpython TestPointNeighborhoodDensity.py <NeighborGrid.so> [Data/popc-membrane.vtp]
"""
import sys

import numpy as np
from vtkmodules.util.numpy_support import vtk_to_numpy
from vtkmodules.vtkIOXML import vtkXMLPolyDataReader

import neighborgrid_testing as T

simple = T.load_plugin(globals())
TOLERANCE = 1e-5


def run_density(poly, kernel, radius, dimension=3, mass_array=None, mass=1.0, method="Auto"):
    f = PointNeighborhood(Input=T.producer(simple, poly))  # noqa: F821 (LoadPlugin)
    f.Operation = "Density"
    f.Backend = "CPU"
    f.Method = method
    f.Kernel = kernel
    f.Radius = radius
    f.Dimension = dimension
    f.MassArray = ["POINTS", mass_array if mass_array else "None"]
    f.Mass = mass
    out = T.output_of(f)
    arr = out.GetPointData().GetArray("Density")
    simple.Delete(f)
    if arr is None:
        return None
    T.check(arr.GetDataTypeAsString() == "float" and arr.GetNumberOfComponents() == 1,
            "Density is float32 with one component")
    return vtk_to_numpy(arr).astype(np.float64)


def compare(label, actual, expected):
    if actual is None:
        T.check(False, "%s: no Density array" % label)
        return
    err = T.max_relative_error(actual, expected)
    T.check(err <= TOLERANCE, "%s: max relative error %.2e <= %g" % (label, err, TOLERANCE))


rng = np.random.default_rng(7)
n = 3000
xyz = T.clustered_points(n, seed=7)
mass = rng.uniform(0.5, 2.0, n)
poly = T.make_polydata(xyz, {"mass": mass.astype(np.float32)})
radius = 0.9

# --- Every kernel, 3D and 2D, per-point masses ---------------------------------------------------
for kernel in T.KERNELS:
    expected = T.sph_interpolator_density(poly, kernel, radius, "mass", 3)
    for method in ("Auto", "Counting Sort"):
        compare("3D %s, mass array, %s" % (kernel, method),
                run_density(poly, kernel, radius, 3, "mass", method=method), expected)

planar = T.make_polydata(np.column_stack([xyz[:, 0], xyz[:, 1], np.zeros(n)]),
                         {"mass": mass.astype(np.float32)})
for kernel in T.KERNELS:
    expected = T.sph_interpolator_density(planar, kernel, radius, "mass", 2)
    compare("2D %s, points in a plane" % kernel,
            run_density(planar, kernel, radius, 2, "mass"), expected)

# --- Constant mass (no mass array): the interpolator with a mass array of that constant ---------
constant = T.make_polydata(xyz, {"m": np.full(n, 2.5, dtype=np.float32)})
expected = T.sph_interpolator_density(constant, "Wendland C2", radius, "m", 3)
compare("constant Mass 2.5", run_density(poly, "Wendland C2", radius, 3, None, mass=2.5), expected)

# --- Brute force agrees (the method changes nothing) -------------------------------------------
small = T.make_polydata(xyz[:800], {"mass": mass[:800].astype(np.float32)})
expected = T.sph_interpolator_density(small, "Quartic Spline", radius, "mass", 3)
compare("Brute Force, Quartic Spline",
        run_density(small, "Quartic Spline", radius, 3, "mass", method="Brute Force"), expected)

# --- Far from the origin: coordinates stored in double around (1e6, -2e6, 5e5) -----------------
# The filter works relative to the bounds' minimum (DESIGN.md), so the result is the same as
# for the cloud at the origin.
offset = np.array([1.0e6, -2.0e6, 5.0e5])
far = T.make_polydata(xyz + offset, {"mass": mass.astype(np.float32)}, double=True)
expected = T.sph_interpolator_density(poly, "Cubic Spline", radius, "mass", 3)
compare("cloud shifted by (1e6, -2e6, 5e5), double coordinates",
        run_density(far, "Cubic Spline", radius, 3, "mass"), expected)

# --- The sample data set: a real MD snapshot, atomic masses ------------------------------------
if len(sys.argv) > 2:
    reader = vtkXMLPolyDataReader()
    reader.SetFileName(sys.argv[2])
    reader.Update()
    sample = reader.GetOutput()
    T.check(sample.GetNumberOfPoints() > 10000, "sample has %d points" % sample.GetNumberOfPoints())
    for kernel in ("Cubic Spline", "Wendland C2"):
        expected = T.sph_interpolator_density(sample, kernel, 5.0, "mass", 3)
        compare("sample %s, R = 5, mass array" % kernel,
                run_density(sample, kernel, 5.0, 3, "mass"), expected)

T.finish()
