"""Per-particle radii (RadiusArray, SmoothingLengthMode) and the Gradient operation of
PointNeighborhood against a numpy brute force in double.

    pvpython TestPointNeighborhoodRadii.py <NeighborGrid.so> [CPU|CUDA]

The backend is CPU unless the second argument says CUDA; with CUDA the test exits 77 (CTest's
SKIP_RETURN_CODE) where the CUDA backend is not usable.

Formulas (README.md, "Per-particle radii" and "Gradient"), r = |x_i - x_j|, h = R / cutoff:
  Gather:    j is a neighbor of i when r <= R_i,            W_ij = W(r, h_i)
  Scatter:   j is a neighbor of i when r <= R_j,            W_ij = W(r, h_j)
  Symmetric: j is a neighbor of i when r <= max(R_i, R_j),  W_ij = (W(r, h_i) + W(r, h_j)) / 2
  NeighborCount_i = #{j != i neighbor}, rho_i = sum_j m_j W_ij, Shepard sum_j W_ij f_j / sum_j W_ij,
  SPH sum_j (m_j / rho_j) f_j W_ij, and
  grad f_i = sum_j (m_j / rho_j) (f_j - f_i) grad_i W_ij, grad_i W = dW/dr (x_i - x_j) / r
  (Symmetric: the mean of the two kernels' gradients).

1. A clustered cloud of 2000 points whose radii are the distance to each point's 16th neighbor
   (they vary by more than 10x): every mode and kernel, every operation, against the brute
   force. Counts must be exact (the pair test is the engine's withinRadius: (dx*dx + dy*dy) + dz*dz
   <= R*R in double, from the float32 input coordinates and radii); density, smoothing and gradient
   agree to float precision (tolerances below, relative to the sum of the magnitudes of the terms).
2. How close the SPH gradient of a linear field f = 2x - 3y + 0.5z is to (2, -3, 0.5) away from
   the boundary. The formula reproduces a linear field only to the extent that
   M_i = sum_j (m_j / rho_j) (x_j - x_i) (grad_i W_ij)^T is the identity: grad f_i = M_i^T G. On a
   lattice M_i is the identity up to the discretization of the kernel's integral; on disordered
   points it carries the particle noise (that is the method, not the float arithmetic: a random
   cloud with 16 neighbors is off by ~50% in double too). Bounds, from the double-precision brute
   force of the same configurations (Cubic Spline, interior points farther than 2 max R from the
   boundary; measured, then rounded up):
     21^3 lattice, fixed R = 2.6:                          measured max 0.38%   -> bound 1%
     21^3 lattice, R = 1.8 * 2^((1 + sin(x/3)) / 2):       measured max 1.9% (Gather), 3.4%
                                                           (Scatter), 2.1% (Symmetric) -> bound 4%
     the same lattice jittered by +-0.15 (seed 12):        measured median 4.1-4.7%, max 13.6-14.4%
                                                           -> bounds median 6%, max 16%
3. Bad radii (0, NaN, negative, a 2-component array, a missing array): an error naming the
   array and the point, an empty output, the input untouched. Probes: Scatter only; Gradient
   at the particles only. Field data: radius_levels and radius_searches.
"""
import math
import sys

import numpy as np
from vtkmodules.util.numpy_support import vtk_to_numpy

import neighborgrid_testing as T

simple = T.load_plugin(globals())
from paraview import servermanager  # noqa: E402

BACKEND = sys.argv[2] if len(sys.argv) > 2 else "CPU"
SKIP = 77
NOT_USABLE = "the CUDA backend was requested but is not usable"
MODES = ["Gather", "Scatter", "Symmetric"]
# Relative to the sum of the magnitudes of the terms of each sum (float32 arithmetic).
DENSITY_TOLERANCE = 1e-5
SMOOTHING_TOLERANCE = 1e-5
GRADIENT_TOLERANCE = 1e-5
G = np.array([2.0, -3.0, 0.5])


# --------------------------------------------------------------------------------------------
# The brute force, in double
def dw_dq(kernel, q):
    p = lambda a: np.maximum(a, 0.0)  # noqa: E731
    if kernel == "Cubic Spline":
        return -0.75 * p(2 - q) ** 2 + 3 * p(1 - q) ** 2
    if kernel == "Quartic Spline":
        return -4 * p(2.5 - q) ** 3 + 20 * p(1.5 - q) ** 3 - 40 * p(0.5 - q) ** 3
    if kernel == "Quintic Spline":
        return -5 * p(3 - q) ** 4 + 30 * p(2 - q) ** 4 - 75 * p(1 - q) ** 4
    if kernel == "Wendland C2":
        return np.where(q < 2, -5 * q * p(1 - q / 2) ** 3, 0.0)
    raise ValueError(kernel)


def squared_distances(a, b):
    """(dx*dx + dy*dy) + dz*dz in double, as the engine's withinRadius computes it."""
    d2 = (a[:, 0][:, None] - b[:, 0][None, :]) ** 2
    d2 = d2 + (a[:, 1][:, None] - b[:, 1][None, :]) ** 2
    return d2 + (a[:, 2][:, None] - b[:, 2][None, :]) ** 2


def pair_terms(kernel, d2, Ri, Rj, mode, dimension):
    """Neighbor mask, W_ij and dW/dr_ij for rows with radii Ri and columns with radii Rj."""
    r = np.sqrt(d2)
    sigma = T.SIGMA[kernel][0 if dimension == 2 else 1]

    def one(R):
        h = R / T.CUTOFF[kernel]
        inside = d2 <= R * R
        q = r / h
        W = np.where(inside, sigma / h ** dimension * T.w_of_q(kernel, q), 0.0)
        dW = np.where(inside, sigma / h ** (dimension + 1) * dw_dq(kernel, q), 0.0)
        return inside, W, dW

    if mode == "Gather":
        return one(Ri[:, None])
    if mode == "Scatter":
        return one(Rj[None, :])
    a, Wa, dWa = one(Ri[:, None])
    b, Wb, dWb = one(Rj[None, :])
    return a | b, 0.5 * (Wa + Wb), 0.5 * (dWa + dWb)


def brute_force(kernel, x, R, mode, mass, fields, dimension=3):
    """Every output of every operation, and the scales (sums of |terms|) the errors are relative to."""
    n = len(x)
    R = np.full(n, float(R)) if np.isscalar(R) else np.asarray(R, dtype=np.float64)
    d2 = squared_distances(x, x)
    inside, W, dW = pair_terms(kernel, d2, R, R, mode, dimension)
    out = {"NeighborCount": inside.sum(1) - 1}
    rho = W @ mass
    out["Density"] = rho
    out["Density_scale"] = np.abs(W) @ mass
    V = mass / rho
    wsum = W.sum(1)
    r = np.sqrt(d2)
    safe_r = np.where(r > 0, r, 1.0)
    grad_w = [np.where(r > 0, dW * (x[:, a][:, None] - x[:, a][None, :]) / safe_r, 0.0) * V[None, :]
              for a in range(3)]
    for name, f in fields.items():
        f2 = f.reshape(n, -1).astype(np.float64)
        out[name + "_shepard"] = (W @ f2) / wsum[:, None]
        out[name + "_shepard_scale"] = (np.abs(W) @ np.abs(f2)) / np.abs(wsum)[:, None]
        out[name + "_sph"] = (W * V[None, :]) @ f2
        out[name + "_sph_scale"] = (np.abs(W * V[None, :])) @ np.abs(f2)
        g = np.zeros((n, 3 * f2.shape[1]))
        g_scale = np.zeros_like(g)
        for c in range(f2.shape[1]):
            df = f2[:, c][None, :] - f2[:, c][:, None]
            for a in range(3):
                terms = grad_w[a] * df
                g[:, 3 * c + a] = terms.sum(1)
                # The float error of a term is about eps (|f_j| + |f_i|) |V grad W|, not eps |term|.
                g_scale[:, 3 * c + a] = (np.abs(grad_w[a]) * (np.abs(f2[:, c][None, :]) + np.abs(f2[:, c][:, None]))).sum(1)
        out[name + "_gradient"] = g
        out[name + "_gradient_scale"] = g_scale
    return out


def worst(actual, expected, scale):
    actual = np.asarray(actual, dtype=np.float64).reshape(expected.shape)
    scale = np.maximum(np.asarray(scale, dtype=np.float64).reshape(expected.shape), 1e-300)
    return float(np.max(np.abs(actual - expected) / scale)) if expected.size else 0.0


# --------------------------------------------------------------------------------------------
# Running the filter
def make_filter(source, operation, radius_array=None, mode=None, kernel="Cubic Spline",
                method="Auto", arrays=(), mass_array=None, radius=1.0, dimension=3, proxy="PointNeighborhood",
                **props):
    f = globals()[proxy](Input=source, **props)
    f.Backend = BACKEND
    f.Method = method
    f.Operation = operation
    f.Kernel = kernel
    f.Dimension = dimension
    f.Radius = radius
    f.RadiusArray = ["POINTS", radius_array if radius_array else "None"]
    if mode is not None:  # else the proxy's default
        f.SmoothingLengthMode = mode
    f.MassArray = ["POINTS", mass_array if mass_array else "None"]
    f.SmoothedArrays = list(arrays)
    return f


def run(source, operation, **kw):
    """(output, error text); the proxy is deleted."""
    f = make_filter(source, operation, **kw)
    errors = T.ErrorCatcher(f)
    out = T.output_of(f)
    result = out.NewInstance()
    result.ShallowCopy(out)
    simple.Delete(f)
    return result, errors.text()


def array(out, name):
    a = out.GetPointData().GetArray(name)
    return None if a is None else vtk_to_numpy(a).astype(np.float64)


def info_lines(out):
    return T.info_string(out).splitlines()


def info_value(out, key):
    for line in info_lines(out):
        if line.startswith(key + "="):
            return line[len(key) + 1:]
    return None


# --------------------------------------------------------------------------------------------
# 1. A clustered cloud, radii = distance to the 16th neighbor
rng = np.random.default_rng(12)
n = 2000
xyz = T.clustered_points(n, seed=12).astype(np.float32).astype(np.float64)
d2_all = squared_distances(xyz, xyz)
radii = np.sqrt(np.sort(d2_all, axis=1)[:, 16]).astype(np.float32)
R = radii.astype(np.float64)
del d2_all
mass = rng.uniform(0.5, 2.0, n).astype(np.float32)
linear = (xyz @ G).astype(np.float32)
pair = np.column_stack([np.sin(xyz[:, 0]), xyz[:, 1] * xyz[:, 2] * 0.1]).astype(np.float32)
velocity = rng.normal(0.0, 1.0, (n, 3)).astype(np.float32)
arrays = {"r": radii, "mass": mass, "f": linear, "pair": pair, "velocity": velocity,
          "r2": np.column_stack([radii, radii]).astype(np.float32)}
poly = T.make_polydata(xyz, arrays)
source = T.producer(simple, poly)
fields = {"f": linear.astype(np.float64), "pair": pair.astype(np.float64),
          "velocity": velocity.astype(np.float64)}
print("radii from %.4g to %.4g (x%.1f)" % (R.min(), R.max(), R.max() / R.min()))
T.check(R.max() / R.min() > 10, "the radii vary by more than 10x (%.1f)" % (R.max() / R.min()))

# Is the backend usable?
probe_out, probe_errors = run(source, "Neighbor Count", radius_array="r")
if BACKEND == "CUDA" and probe_out.GetNumberOfPoints() == 0 and NOT_USABLE in probe_errors:
    print("SKIPPED: " + probe_errors.strip().splitlines()[-1])
    sys.exit(SKIP)

methods = ["Auto", "Counting Sort", "Brute Force"]
if BACKEND == "CUDA":
    methods += ["FENNS", "Radix Sort", "CLAWS", "Bayraktar", "Staged Tiles", "Radius Tree"]

references = {}
for mode in MODES:
    for kernel in T.KERNELS:
        references[(mode, kernel)] = brute_force(kernel, xyz, R, mode, mass.astype(np.float64), fields)

for mode in MODES:
    expected_counts = references[(mode, "Cubic Spline")]["NeighborCount"]
    for method in methods:
        label = "%s, %s" % (mode, method)
        out, errors = run(source, "Neighbor Count", radius_array="r", mode=mode, method=method)
        counts = array(out, "NeighborCount")
        if not T.check(counts is not None, "%s: NeighborCount written (%s)" % (label, errors[:300])):
            continue
        wrong = int(np.sum(counts != expected_counts))
        T.check(wrong == 0, "%s: NeighborCount equals the brute force (%d of %d differ)" % (label, wrong, n))
        lines = info_lines(out)
        T.check("radius=array 'r'" in lines and "smoothing_length_mode=%s" % mode in lines,
                "%s: NeighborGridInfo names the radius array and the mode" % label)
        levels, searches = info_value(out, "radius_levels"), info_value(out, "radius_searches")
        max_levels = int(math.floor(math.log2(R.max() / R.min()))) + 1
        T.check(levels is not None and 1 <= int(levels) <= max_levels + 1 and searches is not None
                and int(searches) >= int(levels),
                "%s: radius_levels=%s (radii within 2x of each other: at most %d), radius_searches=%s"
                % (label, levels, max_levels + 1, searches))

    for kernel in T.KERNELS:
        ref = references[(mode, kernel)]
        for method in (methods if kernel == "Cubic Spline" else ["Auto"]):
            label = "%s, %s, %s" % (mode, kernel, method)
            out, errors = run(source, "Density", radius_array="r", mode=mode, kernel=kernel, method=method,
                              mass_array="mass")
            rho = array(out, "Density")
            if T.check(rho is not None, "%s: Density written (%s)" % (label, errors[:300])):
                err = worst(rho, ref["Density"], ref["Density_scale"])
                T.check(err <= DENSITY_TOLERANCE, "%s: Density error %.2e <= %g" % (label, err, DENSITY_TOLERANCE))

            out, errors = run(source, "Gradient", radius_array="r", mode=mode, kernel=kernel, method=method,
                              mass_array="mass", arrays=["f", "pair"])
            for name, components in (("f", 1), ("pair", 2)):
                g = out.GetPointData().GetArray(name + "_gradient")
                if not T.check(g is not None, "%s: %s_gradient written (%s)" % (label, name, errors[:300])):
                    continue
                T.check(g.GetDataTypeAsString() == "float" and g.GetNumberOfComponents() == 3 * components
                        and g.GetNumberOfTuples() == n,
                        "%s: %s_gradient is float32 with %d components" % (label, name, 3 * components))
                err = worst(vtk_to_numpy(g), ref[name + "_gradient"], ref[name + "_gradient_scale"])
                T.check(err <= GRADIENT_TOLERANCE, "%s: %s_gradient error %.2e <= %g"
                        % (label, name, err, GRADIENT_TOLERANCE))
            rho = array(out, "Density")
            if T.check(rho is not None, "%s: Gradient also writes Density" % label):
                err = worst(rho, ref["Density"], ref["Density_scale"])
                T.check(err <= DENSITY_TOLERANCE, "%s: Gradient's Density error %.2e" % (label, err))

    ref = references[(mode, "Cubic Spline")]
    for normalization in ("Shepard", "SPH"):
        label = "%s, %s smoothing" % (mode, normalization)
        out, errors = run(source, "Kernel Smoothing", radius_array="r", mode=mode, mass_array="mass",
                          arrays=["velocity", "f"], Normalization=normalization)
        for name in ("velocity", "f"):
            s = array(out, name + "_smoothed")
            if T.check(s is not None, "%s: %s_smoothed written (%s)" % (label, name, errors[:300])):
                key = name + ("_shepard" if normalization == "Shepard" else "_sph")
                err = worst(s, ref[key], ref[key + "_scale"])
                T.check(err <= SMOOTHING_TOLERANCE, "%s: %s error %.2e <= %g" % (label, name, err, SMOOTHING_TOLERANCE))

# Component names of the gradient arrays.
out, _ = run(source, "Gradient", radius_array="r", arrays=["f", "velocity"])
g = out.GetPointData().GetArray("f_gradient")
names = [g.GetComponentName(i) for i in range(3)] if g else []
T.check(names == ["d/dx", "d/dy", "d/dz"], "f_gradient components d/dx d/dy d/dz (got %s)" % names)
g = out.GetPointData().GetArray("velocity_gradient")
names = [g.GetComponentName(i) for i in range(9)] if g else []
T.check(names[:4] == ["d0/dx", "d0/dy", "d0/dz", "d1/dx"], "velocity_gradient components d0/dx ... (got %s)" % names)

# Gradient with a fixed Radius (no radius array), and in 2D.
ref = brute_force("Wendland C2", xyz, 0.9, "Gather", np.ones(n), {"f": fields["f"]})
out, errors = run(source, "Gradient", radius=0.9, kernel="Wendland C2", arrays=["f"])
g = array(out, "f_gradient")
if T.check(g is not None, "fixed Radius: f_gradient written (%s)" % errors[:300]):
    # Up to 416 neighbors in the clusters (29 typical): float sums of that many terms round more.
    err = worst(g, ref["f_gradient"], ref["f_gradient_scale"])
    T.check(err <= 2 * GRADIENT_TOLERANCE, "fixed Radius 0.9, Wendland C2: gradient error %.2e <= %g"
            % (err, 2 * GRADIENT_TOLERANCE))
    T.check(info_value(out, "radius") == "0.9" and info_value(out, "radius_levels") is None,
            "fixed Radius: radius=0.9 and no radius_levels in NeighborGridInfo")

planar_xyz = np.column_stack([xyz[:, 0], xyz[:, 1], np.zeros(n)])
planar_f = (planar_xyz @ G).astype(np.float32)
d2p = squared_distances(planar_xyz, planar_xyz)
planar_r = np.sqrt(np.sort(d2p, axis=1)[:, 12]).astype(np.float32)
del d2p
planar = T.producer(simple, T.make_polydata(planar_xyz, {"f": planar_f, "r": planar_r}))
for mode in MODES:
    ref = brute_force("Cubic Spline", planar_xyz, planar_r.astype(np.float64), mode, np.ones(n),
                      {"f": planar_f.astype(np.float64)}, dimension=2)
    out, errors = run(planar, "Gradient", radius_array="r", mode=mode, dimension=2, arrays=["f"])
    g = array(out, "f_gradient")
    if T.check(g is not None, "2D %s: f_gradient written (%s)" % (mode, errors[:300])):
        err = worst(g, ref["f_gradient"], ref["f_gradient_scale"])
        T.check(err <= GRADIENT_TOLERANCE, "2D %s, radii: gradient error %.2e" % (mode, err))
        T.check(np.all(g[:, 2] == 0.0), "2D %s: d/dz is 0 for points in a plane" % mode)

# --------------------------------------------------------------------------------------------
# 2. The gradient of a linear field away from the boundary
m = 21
axis = np.arange(m, dtype=np.float64)
lattice = np.stack(np.meshgrid(axis, axis, axis, indexing="ij"), -1).reshape(-1, 3)
jittered = lattice + np.random.default_rng(12).uniform(-0.15, 0.15, lattice.shape)
varying = (1.8 * 2.0 ** ((1.0 + np.sin(lattice[:, 0] / 3.0)) / 2.0)).astype(np.float32)


def interior_errors(x, radius_array, mode, radius=1.0):
    x = x.astype(np.float32).astype(np.float64)
    data = {"f": (x @ G).astype(np.float32)}
    if radius_array is not None:
        data["r"] = radius_array
    out, errors = run(T.producer(simple, T.make_polydata(x, data)), "Gradient", mode=mode, arrays=["f"],
                      radius_array="r" if radius_array is not None else None, radius=radius)
    g = array(out, "f_gradient")
    if g is None:
        T.check(False, "interior: no f_gradient (%s)" % errors[:300])
        return np.array([np.inf])
    reach = 2.0 * (radius_array.max() if radius_array is not None else radius)
    interior = np.all((x > reach) & (x < m - 1 - reach), axis=1)
    return np.linalg.norm(g[interior] - G, axis=1) / np.linalg.norm(G)


e = interior_errors(lattice, None, "Gather", radius=2.6)
T.check(e.max() <= 0.01, "lattice, fixed R 2.6: interior gradient error max %.4f <= 0.01 (%d points)"
        % (e.max(), e.size))
for mode in MODES:
    e = interior_errors(lattice, varying, mode)
    T.check(e.max() <= 0.04, "lattice, R 1.8..3.6, %s: interior gradient error max %.4f <= 0.04 (%d points)"
            % (mode, e.max(), e.size))
    e = interior_errors(jittered, varying, mode)
    T.check(np.median(e) <= 0.06 and e.max() <= 0.16,
            "jittered lattice, R 1.8..3.6, %s: interior gradient error median %.4f <= 0.06, max %.4f <= 0.16"
            % (mode, np.median(e), e.max()))

# --------------------------------------------------------------------------------------------
# 3. Errors, probes, defaults
def expect_error(label, dataset, operation, texts, **kw):
    """The filter on `dataset` fails with every one of `texts` in its error, an empty output, and
    `dataset`'s point arrays unchanged."""
    pd = dataset.GetPointData()
    before = [vtk_to_numpy(pd.GetArray(i)).copy() for i in range(pd.GetNumberOfArrays())]
    out, errors = run(T.producer(simple, dataset), operation, **kw)
    for text in texts:
        T.check(text in errors, "%s: the error mentions %r (got %r)" % (label, text, errors[-400:]))
    T.check(out.GetNumberOfPoints() == 0 and out.GetPointData().GetNumberOfArrays() == 0,
            "%s: the output is empty" % label)
    T.check(len(before) == pd.GetNumberOfArrays() and
            all(np.array_equal(b, vtk_to_numpy(pd.GetArray(i)), equal_nan=True) for i, b in enumerate(before)),
            "%s: the input is untouched" % label)


bad = {}
for name, index, value in (("r_zero", 7, 0.0), ("r_nan", 11, np.nan), ("r_negative", 13, -0.5)):
    values = radii.copy()
    values[index] = value
    bad[name] = (index, values)
bad_arrays = dict(arrays)
bad_arrays.update({k: v for k, (i, v) in bad.items()})
bad_arrays["r_double"] = np.where(np.arange(n) == 17, 1e-60, R)  # 0 once converted to float
bad_poly = T.make_polydata(xyz, bad_arrays)
for name, (index, values) in bad.items():
    for operation in ("Neighbor Count", "Density", "Gradient"):
        expect_error("%s, %s" % (name, operation), bad_poly, operation, ["'%s'" % name, "point %d" % index],
                     radius_array=name, arrays=["f"])
expect_error("a double radius below float's range", bad_poly, "Density", ["'r_double'", "point 17"],
             radius_array="r_double")
expect_error("a 2-component radius array", bad_poly, "Density", ["'r2'", "2 components"], radius_array="r2")
expect_error("a missing radius array", bad_poly, "Density", ["'no_such_radius'"], radius_array="no_such_radius")
expect_error("Gradient without arrays", bad_poly, "Gradient", ["Gradient", "at least one"], radius_array="r")

# The radius array replaces Radius: a bad Radius does not matter then.
out, errors = run(source, "Neighbor Count", radius_array="r", radius=0.0)
T.check(out.GetPointData().GetArray("NeighborCount") is not None and not errors,
        "Radius 0 is not used (nor an error) with a radius array (%s)" % errors[:200])

# Probes: the particles' radii, Scatter only; no gradient.
probe_points = T.producer(simple, T.make_polydata(xyz[:300]))
ref = references[("Scatter", "Cubic Spline")]
f = make_filter(source, "Neighbor Count", radius_array="r", proxy="PointNeighborhoodProbe", Source=probe_points)
T.check(f.SmoothingLengthMode == "Scatter", "Probe: SmoothingLengthMode defaults to Scatter (got %s)"
        % f.SmoothingLengthMode)
f.SmoothingLengthMode = "Scatter"
out = T.output_of(f)
counts = array(out, "NeighborCount")
# A probe at a particle's position counts that particle too.
T.check(counts is not None and np.array_equal(counts, ref["NeighborCount"][:300] + 1),
        "Probe at the particles, Scatter: counts are the particles' Scatter counts + 1")
f.Operation = "Density"
f.MassArray = ["POINTS", "mass"]
out = T.output_of(f)
rho = array(out, "Density")
T.check(rho is not None and worst(rho, ref["Density"][:300], ref["Density_scale"][:300]) <= DENSITY_TOLERANCE,
        "Probe at the particles, Scatter: density equals the particles' Scatter density")
for mode in ("Gather", "Symmetric"):
    f.SmoothingLengthMode = mode
    errors = T.ErrorCatcher(f)
    out = T.output_of(f)
    T.check("Scatter" in errors.text() and out.GetNumberOfPoints() == 0,
            "Probe with %s: an error that says only Scatter applies (%r)" % (mode, errors.text()[-300:]))
f.SmoothingLengthMode = "Scatter"
f.Operation = "Gradient"
f.SmoothedArrays = ["f"]
errors = T.ErrorCatcher(f)
out = T.output_of(f)
T.check("particles only" in errors.text() and out.GetNumberOfPoints() == 0,
        "Probe with Gradient: an error that says it is computed at the particles only (%r)" % errors.text()[-300:])
simple.Delete(f)

# Volume: Scatter by default, padding = the largest radius.
f = make_filter(source, "Density", radius_array="r", proxy="PointNeighborhoodVolume", mode="Scatter")
f.Resolution = [8, 8, 8]
out = T.output_of(f)
bounds = out.GetBounds() if out.GetNumberOfPoints() else None
lo = xyz.min(0) - radii.max()
hi = xyz.max(0) + radii.max()
T.check(bounds is not None and np.allclose(bounds[0::2], lo, rtol=0, atol=1e-5)
        and np.allclose(bounds[1::2], hi, rtol=0, atol=1e-5),
        "Volume with a radius array: the box is the particles' bounds padded by the largest radius (%s)" % (bounds,))
simple.Delete(f)

# Defaults: RadiusArray None (also when the input's active scalars are a 1-component array, and
# in the GUI's order of calls), SmoothingLengthMode Gather.
poly.GetPointData().SetActiveScalars("r")
scalars_source = T.producer(simple, poly)
f = PointNeighborhood(Input=scalars_source)  # noqa: F821
T.check(list(f.RadiusArray) == ["POINTS", "None"] and f.SmoothingLengthMode == "Gather",
        "PointNeighborhood: RadiusArray None and SmoothingLengthMode Gather by default (got %s, %s)"
        % (list(f.RadiusArray), f.SmoothingLengthMode))
controller = servermanager.ParaViewPipelineController()
gui = servermanager._getPyProxy(servermanager.ProxyManager().SMProxyManager.NewProxy("filters", "PointNeighborhood"))
controller.PreInitializeProxy(gui.SMProxy)
gui.GetProperty("Input").SMProperty.SetInputConnection(0, scalars_source.SMProxy, 0)
controller.PostInitializeProxy(gui.SMProxy)
T.check(list(gui.RadiusArray) == ["POINTS", "None"], "GUI order of calls: RadiusArray None (got %s)"
        % list(gui.RadiusArray))

T.finish()
