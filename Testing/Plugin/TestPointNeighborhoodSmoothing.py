"""Kernel Smoothing of PointNeighborhood (Backend 'CPU') against a numpy reference in double.

Shepard: f_i = sum_j W_ij f_j / sum_j W_ij; SPH: f_i = sum_j (m_j / rho_j) f_j W_ij with
rho_j = sum_k m_k W_jk (DESIGN.md). Arrays of any numeric type and number of components, written
as float32 "<name>_smoothed" with the same number of components; inputs never modified.

    pvpython TestPointNeighborhoodSmoothing.py <NeighborGrid.so>
"""
import numpy as np
from vtkmodules.util.numpy_support import vtk_to_numpy

import neighborgrid_testing as T

simple = T.load_plugin(globals())
TOLERANCE = 1e-5

rng = np.random.default_rng(5)
n = 2000
xyz = T.clustered_points(n, seed=5).astype(np.float32).astype(np.float64)
radius = 1.0
arrays = {
    # a smooth field plus noise, double
    "temperature": (300.0 + 20.0 * np.sin(xyz[:, 0]) * np.cos(xyz[:, 1]) + rng.normal(0, 1, n)),
    # a vector field with sign changes, float32
    "velocity": np.column_stack([np.sin(xyz[:, 1]), np.cos(xyz[:, 2]), xyz[:, 0] - 5.0]
                                ).astype(np.float32),
    # integers
    "label": rng.integers(-50, 50, n).astype(np.int32),
    # a constant: Shepard reproduces it exactly
    "constant": np.full(n, 7.25, dtype=np.float32),
    "mass": rng.uniform(0.5, 2.0, n).astype(np.float32),
}
poly = T.make_polydata(xyz, arrays)
originals = {k: vtk_to_numpy(poly.GetPointData().GetArray(k)).copy() for k in arrays}
dist = T.pair_distances(xyz)


def run_smoothing(names, kernel, normalization, mass_array=None, mass=1.0, method="Auto"):
    f = PointNeighborhood(Input=T.producer(simple, poly))  # noqa: F821 (LoadPlugin)
    f.Operation = "Kernel Smoothing"
    f.Backend = "CPU"
    f.Method = method
    f.Kernel = kernel
    f.Radius = radius
    f.Normalization = normalization
    f.SmoothedArrays = names
    f.MassArray = ["POINTS", mass_array if mass_array else "None"]
    f.Mass = mass
    out = T.output_of(f)
    simple.Delete(f)
    return out


def as_2d(values):
    v = np.asarray(values, dtype=np.float64)
    return v[:, None] if v.ndim == 1 else v


def compare(label, out, name, expected, scale):
    arr = out.GetPointData().GetArray(name + "_smoothed")
    if not T.check(arr is not None, "%s: %s_smoothed exists" % (label, name)):
        return
    components = as_2d(arrays[name]).shape[1]
    T.check(arr.GetDataTypeAsString() == "float" and arr.GetNumberOfComponents() == components
            and arr.GetNumberOfTuples() == n,
            "%s: %s_smoothed is float32 with %d component(s)" % (label, name, components))
    actual = as_2d(vtk_to_numpy(arr))
    err = float(np.max(np.abs(actual - expected) / scale))
    T.check(err <= TOLERANCE, "%s: %s max error %.2e <= %g (relative to sum |w f|)" % (
        label, name, err, TOLERANCE))


smoothed_names = ["temperature", "velocity", "label", "constant"]
for kernel in T.KERNELS:
    W = T.kernel_matrix(kernel, dist, radius, 3)
    wsum = W.sum(1)[:, None]
    out = run_smoothing(smoothed_names, kernel, "Shepard")
    for name in smoothed_names:
        f = as_2d(arrays[name])
        expected = W @ f / wsum
        scale = (W @ np.abs(f)) / wsum  # the size of the terms summed: the float error scale
        compare("Shepard %s" % kernel, out, name, expected, np.maximum(scale, 1e-30))
    if kernel == "Cubic Spline":
        T.check(out.GetPointData().GetArray("Density") is None, "Shepard writes no Density")
        const = vtk_to_numpy(out.GetPointData().GetArray("constant_smoothed"))
        T.check(np.max(np.abs(const - 7.25)) <= 7.25 * TOLERANCE, "Shepard reproduces a constant")

# SPH normalization, per-point masses and constant mass
for kernel, mass_array, mass in (("Cubic Spline", "mass", 1.0), ("Wendland C2", "mass", 1.0),
                                 ("Quintic Spline", None, 3.0)):
    W = T.kernel_matrix(kernel, dist, radius, 3)
    m = arrays["mass"].astype(np.float64) if mass_array else np.full(n, mass)
    rho = W @ m
    volume = m / rho
    label = "SPH %s, %s" % (kernel, "mass array" if mass_array else "Mass %g" % mass)
    out = run_smoothing(["temperature", "velocity"], kernel, "SPH", mass_array, mass)
    for name in ("temperature", "velocity"):
        f = as_2d(arrays[name])
        expected = W @ (volume[:, None] * f)
        scale = W @ (volume[:, None] * np.abs(f))
        compare(label, out, name, expected, np.maximum(scale, 1e-30))
    density = out.GetPointData().GetArray("Density")
    if T.check(density is not None, "%s: SPH normalization also writes Density" % label):
        err = T.max_relative_error(vtk_to_numpy(density), rho)
        T.check(err <= TOLERANCE, "%s: Density max relative error %.2e" % (label, err))

# Every method gives the same smoothing
W = T.kernel_matrix("Quartic Spline", dist, radius, 3)
f = as_2d(arrays["velocity"])
for method in ("Counting Sort", "Brute Force"):
    out = run_smoothing(["velocity"], "Quartic Spline", "Shepard", method=method)
    compare("Shepard Quartic Spline, %s" % method, out, "velocity",
            W @ f / W.sum(1)[:, None], (W @ np.abs(f)) / W.sum(1)[:, None])

# Inputs never modified
for name, values in originals.items():
    now = vtk_to_numpy(poly.GetPointData().GetArray(name))
    T.check(np.array_equal(now, values), "input array %s unchanged" % name)
T.check(poly.GetPointData().GetArray("temperature_smoothed") is None,
        "no result array added to the input")

# An array that does not exist: an error, and an empty output rather than a pass-through
f = PointNeighborhood(Input=T.producer(simple, poly))  # noqa: F821
f.Operation = "Kernel Smoothing"
f.Backend = "CPU"
f.Radius = radius
f.SmoothedArrays = ["no_such_array"]
errors = T.ErrorCatcher(f)
out = T.output_of(f)
T.check("no_such_array" in errors.text(), "a missing array is reported by name (got %r)" % errors.messages)
T.check(out.GetNumberOfPoints() == 0, "a failed run leaves an empty output")

T.finish()
