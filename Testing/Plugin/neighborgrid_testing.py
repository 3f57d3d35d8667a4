"""Shared helpers of the NeighborGrid pvpython tests (Testing/Plugin).

Every test script takes the path of the built plugin (NeighborGrid.so) as its first argument and
may take more paths after it (CMakeLists.txt passes them). Point sets are made with numpy and VTK,
handed to the pipeline through a PVTrivialProducer (builtin session), and results are read from
the filter's client-side output.
"""
import math
import sys

import numpy as np
from vtkmodules.util.numpy_support import numpy_to_vtk, vtk_to_numpy
from vtkmodules.vtkCommonCore import VTK_STRING, vtkPoints
from vtkmodules.vtkCommonDataModel import vtkPolyData
from vtkmodules.vtkFiltersPoints import (
    vtkSPHCubicKernel,
    vtkSPHInterpolator,
    vtkSPHQuarticKernel,
    vtkSPHQuinticKernel,
    vtkWendlandQuinticKernel,
)

KERNELS = ["Cubic Spline", "Quartic Spline", "Quintic Spline", "Wendland C2"]
CUTOFF = {"Cubic Spline": 2.0, "Quartic Spline": 2.5, "Quintic Spline": 3.0, "Wendland C2": 2.0}
SIGMA = {  # (2D, 3D), DESIGN.md
    "Cubic Spline": (10.0 / (7.0 * math.pi), 1.0 / math.pi),
    "Quartic Spline": (96.0 / (1199.0 * math.pi), 1.0 / (20.0 * math.pi)),
    "Quintic Spline": (7.0 / (478.0 * math.pi), 1.0 / (120.0 * math.pi)),
    "Wendland C2": (7.0 / (4.0 * math.pi), 21.0 / (16.0 * math.pi)),
}
VTK_KERNEL = {
    "Cubic Spline": vtkSPHCubicKernel,
    "Quartic Spline": vtkSPHQuarticKernel,
    "Quintic Spline": vtkSPHQuinticKernel,
    "Wendland C2": vtkWendlandQuinticKernel,
}

FAILURES = []


def check(condition, message):
    """Record a failure (the test goes on, so one run reports every problem)."""
    if condition:
        print("ok   " + message)
    else:
        print("FAIL " + message)
        FAILURES.append(message)
    return condition


def finish():
    if FAILURES:
        print("%d check(s) failed:" % len(FAILURES))
        for f in FAILURES:
            print("  " + f)
        sys.exit(1)
    print("all checks passed")
    sys.exit(0)


def plugin_path():
    if len(sys.argv) < 2:
        sys.exit("usage: pvpython %s <path/to/NeighborGrid.so> [...]" % sys.argv[0])
    return sys.argv[1]


def load_plugin(ns):
    """LoadPlugin(NeighborGrid.so, ns=...) and return paraview.simple."""
    from paraview import simple

    simple.LoadPlugin(plugin_path(), ns=ns)
    return simple


# --------------------------------------------------------------------------------------------
# Data
def make_polydata(xyz, arrays=None, double=False):
    """vtkPolyData with the given points (no cells needed by the filter) and point arrays."""
    xyz = np.ascontiguousarray(xyz, dtype=np.float64 if double else np.float32)
    pts = vtkPoints()
    pts.SetData(numpy_to_vtk(xyz, deep=True))
    poly = vtkPolyData()
    poly.SetPoints(pts)
    for name, values in (arrays or {}).items():
        arr = numpy_to_vtk(np.ascontiguousarray(values), deep=True)
        arr.SetName(name)
        poly.GetPointData().AddArray(arr)
    return poly


def clustered_points(n, seed=1, scale=10.0):
    """A non-uniform cloud: Gaussian clusters of different widths plus a uniform background."""
    rng = np.random.default_rng(seed)
    parts = []
    remaining = n
    for width in (0.4, 0.8, 1.5):
        k = n // 4
        center = rng.uniform(0.2 * scale, 0.8 * scale, 3)
        parts.append(rng.normal(center, width * scale / 10.0, (k, 3)))
        remaining -= k
    parts.append(rng.uniform(0.0, scale, (remaining, 3)))
    xyz = np.concatenate(parts)
    rng.shuffle(xyz)
    return xyz


def producer(simple, dataobject):
    """A PVTrivialProducer proxy serving `dataobject` (builtin session only)."""
    tp = simple.PVTrivialProducer()
    tp.GetClientSideObject().SetOutput(dataobject)
    tp.UpdatePipeline()
    return tp


def output_of(proxy):
    proxy.UpdatePipeline()
    return proxy.GetClientSideObject().GetOutputDataObject(0)


def point_array(dataset, name):
    arr = dataset.GetPointData().GetAbstractArray(name)
    return arr


def info_string(dataset):
    """The field-data array NeighborGridInfo as one string ('' when missing)."""
    arr = dataset.GetFieldData().GetAbstractArray("NeighborGridInfo")
    if arr is None:
        return ""
    return "\n".join(arr.GetValue(i) for i in range(arr.GetNumberOfValues()))


class ErrorCatcher:
    """Collects the vtkErrorMacro messages of the filter behind a proxy (builtin session)."""

    def __init__(self, proxy):
        self.messages = []
        self.algorithm = proxy.GetClientSideObject()
        self.tag = self.algorithm.AddObserver("ErrorEvent", self._on_error)

    def _on_error(self, obj, event, calldata=None):
        self.messages.append(str(calldata))

    _on_error.CallDataType = VTK_STRING  # the message comes as calldata

    def text(self):
        return "\n".join(self.messages)


# --------------------------------------------------------------------------------------------
# References
def pair_distances(xyz):
    """Dense N x N distance matrix in double (a few thousand points at most)."""
    x = np.asarray(xyz, dtype=np.float64)
    d2 = np.zeros((len(x), len(x)))
    for c in range(3):
        diff = x[:, c][:, None] - x[:, c][None, :]
        d2 += diff * diff
    return np.sqrt(d2)


def w_of_q(kernel, q):
    p = lambda a: np.maximum(a, 0.0)  # noqa: E731
    if kernel == "Cubic Spline":
        return 0.25 * p(2 - q) ** 3 - p(1 - q) ** 3
    if kernel == "Quartic Spline":
        return p(2.5 - q) ** 4 - 5 * p(1.5 - q) ** 4 + 10 * p(0.5 - q) ** 4
    if kernel == "Quintic Spline":
        return p(3 - q) ** 5 - 6 * p(2 - q) ** 5 + 15 * p(1 - q) ** 5
    if kernel == "Wendland C2":
        return np.where(q < 2, p(1 - q / 2) ** 4 * (1 + 2 * q), 0.0)
    raise ValueError(kernel)


def kernel_matrix(kernel, dist, radius, dimension=3):
    """W_ij = sigma_d h^-d w(r/h), h = R / cutoff (DESIGN.md), in double."""
    h = radius / CUTOFF[kernel]
    sigma = SIGMA[kernel][0 if dimension == 2 else 1]
    return sigma / h ** dimension * w_of_q(kernel, dist / h)


def sph_interpolator_density(poly, kernel, radius, mass_name, dimension=3):
    """sum_j m_j W_ij from vtkSPHInterpolator (probe = source = the particles, density = 1).

    DESIGN.md: with SpatialStep = h = R / cutoff, a mass array and a density array of ones on
    the source, the "Shepard Summation" output is exactly sum_j m_j W_ij.
    """
    source = vtkPolyData()
    source.ShallowCopy(poly)
    n = poly.GetNumberOfPoints()
    ones = numpy_to_vtk(np.ones(n, dtype=np.float64), deep=True)
    ones.SetName("__ones")
    source.GetPointData().AddArray(ones)
    k = VTK_KERNEL[kernel]()
    k.SetSpatialStep(radius / CUTOFF[kernel])
    k.SetDimension(dimension)
    interp = vtkSPHInterpolator()
    interp.SetInputData(poly)
    interp.SetSourceData(source)
    interp.SetKernel(k)
    interp.SetMassArrayName(mass_name)
    interp.SetDensityArrayName("__ones")
    interp.SetComputeShepardSum(True)
    interp.SetShepardNormalization(False)
    interp.SetPassPointArrays(False)
    interp.Update()
    out = interp.GetOutput().GetPointData().GetArray(interp.GetShepardSumArrayName())
    return vtk_to_numpy(out).astype(np.float64)


def max_relative_error(actual, expected):
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    scale = np.maximum(np.abs(expected), 1e-300)
    return float(np.max(np.abs(actual - expected) / scale)) if actual.size else 0.0
