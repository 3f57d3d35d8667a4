"""PointNeighborhood with Backend 'CUDA' against Backend 'CPU' (CTest label gpu).

Exits 77 (CTest SKIP_RETURN_CODE: "skipped") when the filter reports that the CUDA backend is not
usable (no device, no driver, or a build without CUDA); any other failure fails the test.

    pvpython TestPointNeighborhoodCUDA.py <NeighborGrid.so>
"""
import sys

import numpy as np
from vtkmodules.util.numpy_support import vtk_to_numpy

import neighborgrid_testing as T

simple = T.load_plugin(globals())
SKIP = 77
NOT_USABLE = "the CUDA backend was requested but is not usable"

n = 4000
xyz = T.clustered_points(n, seed=3).astype(np.float32).astype(np.float64)
rng = np.random.default_rng(3)
poly = T.make_polydata(xyz, {
    "mass": rng.uniform(0.5, 2.0, n).astype(np.float32),
    "velocity": rng.normal(0, 1, (n, 3)).astype(np.float32),
})
radius = 0.8


def run(backend, operation, method="Auto", kernel="Cubic Spline", **props):
    f = PointNeighborhood(Input=T.producer(simple, poly))  # noqa: F821 (LoadPlugin)
    f.Backend = backend
    f.Method = method
    f.Operation = operation
    f.Kernel = kernel
    f.Radius = radius
    for key, value in props.items():
        setattr(f, key, value)
    errors = T.ErrorCatcher(f)
    out = T.output_of(f)
    simple.Delete(f)
    return out, errors.text()


# --- Is CUDA usable? ------------------------------------------------------------------------------
out, errors = run("CUDA", "Density", MassArray=["POINTS", "mass"])
if out.GetPointData().GetArray("Density") is None:
    if NOT_USABLE in errors:
        print("SKIPPED: " + errors.strip().splitlines()[-1])
        sys.exit(SKIP)
    T.check(False, "Backend CUDA failed: %s" % errors)
    T.finish()

info = T.info_string(out).splitlines()
T.check("backend=CUDA" in info, "Backend CUDA ran on CUDA (%s)" % [e for e in info if "device" in e])
auto, _ = run("Auto", "Neighbor Count")
T.check("backend=CUDA" in T.info_string(auto).splitlines(), "Backend Auto picks the usable GPU")

# --- Every method and operation against the CPU ------------------------------------------------
lo_hi = None
for method in ("Auto", "Counting Sort", "Brute Force", "FENNS", "Radix Sort", "CLAWS", "Bayraktar", "Staged Tiles",
               "Radius Tree"):
    # FENNS, Radix Sort, CLAWS, Bayraktar, Staged Tiles and Radius Tree run on CUDA only: compare them with the CPU's Counting Sort.
    cpu_method = method if method in ("Auto", "Counting Sort", "Brute Force") else "Counting Sort"
    for kernel in T.KERNELS:
        gpu, err = run("CUDA", "Density", method, kernel, MassArray=["POINTS", "mass"])
        cpu, _ = run("CPU", "Density", cpu_method, kernel, MassArray=["POINTS", "mass"])
        g = gpu.GetPointData().GetArray("Density")
        c = cpu.GetPointData().GetArray("Density")
        if T.check(g is not None and c is not None, "Density %s %s on both backends %s" % (
                method, kernel, err)):
            e = T.max_relative_error(vtk_to_numpy(g), vtk_to_numpy(c))
            T.check(e <= 1e-5, "Density %s %s: CUDA vs CPU %.2e" % (method, kernel, e))

    gpu, err = run("CUDA", "Neighbor Count", method)
    g = gpu.GetPointData().GetArray("NeighborCount")
    if T.check(g is not None, "NeighborCount %s on CUDA %s" % (method, err)):
        if lo_hi is None:
            d = T.pair_distances(xyz)
            np.fill_diagonal(d, np.inf)
            lo_hi = ((d < radius * (1 - 1e-6)).sum(1), (d <= radius * (1 + 1e-6)).sum(1))
        counts = vtk_to_numpy(g)
        bad = np.count_nonzero((counts < lo_hi[0]) | (counts > lo_hi[1]))
        T.check(bad == 0, "NeighborCount %s on CUDA: %d wrong of %d" % (method, bad, n))

    for normalization in ("Shepard", "SPH"):
        props = dict(SmoothedArrays=["velocity"], Normalization=normalization,
                     MassArray=["POINTS", "mass"])
        gpu, err = run("CUDA", "Kernel Smoothing", method, "Wendland C2", **props)
        cpu, _ = run("CPU", "Kernel Smoothing", cpu_method, "Wendland C2", **props)
        g = gpu.GetPointData().GetArray("velocity_smoothed")
        c = cpu.GetPointData().GetArray("velocity_smoothed")
        if T.check(g is not None and c is not None, "Smoothing %s %s on both %s" % (
                method, normalization, err)):
            g, c = vtk_to_numpy(g), vtk_to_numpy(c)
            e = float(np.max(np.abs(g - c)) / np.max(np.abs(c)))
            T.check(e <= 1e-5, "Smoothing %s %s: CUDA vs CPU %.2e of max" % (method, normalization, e))

T.finish()
