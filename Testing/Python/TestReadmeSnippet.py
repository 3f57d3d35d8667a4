"""Runs the README's Python example (section "From Python (VTK)") as printed there, and checks it.

    PYTHONPATH=<folder of neighborgrid> pvpython TestReadmeSnippet.py README.md

The snippet is read from README.md itself (the first ```python block after the heading), so the
test and the README cannot drift apart. It must run as written, and its `density` must be the SPH
density of its `cloud`: a float32 numpy array, one value per point, equal (1e-5 relative, README
"Conventions") to a double-precision brute force with the filter's defaults (Cubic Spline in 3D,
h = R / 2, mass 1, the point itself included) at a random sample of the points.
"""
import math
import re
import sys

import numpy as np
from vtkmodules.util.numpy_support import vtk_to_numpy

HEADING = "### From Python (VTK)"

with open(sys.argv[1], encoding="utf-8") as f:
    readme = f.read()
start = readme.find("\n" + HEADING + "\n")
if start < 0:
    sys.exit("FAIL README has no heading %r" % HEADING)
block = re.search(r"^```python\n(.*?)^```$", readme[start:], re.S | re.M)
if not block:
    sys.exit("FAIL no ```python block after %r" % HEADING)
snippet = block.group(1)
print("running the README's snippet (%d lines)" % len(snippet.splitlines()))
namespace = {"__name__": "__main__"}
exec(compile(snippet, "README.md (%s)" % HEADING, "exec"), namespace)

failures = []
f = namespace["f"]
if (f.GetKernel(), f.GetDimension(), f.GetMass()) != (f.CUBIC_SPLINE, 3, 1.0):
    failures.append("the snippet no longer uses the defaults this check assumes (Cubic Spline, 3D, mass 1)")
xyz = vtk_to_numpy(namespace["cloud"].GetPoints().GetData()).astype(np.float64)
density = namespace["density"]
if not (isinstance(density, np.ndarray) and density.dtype == np.float32 and density.shape == (len(xyz),)):
    failures.append("density is not a float32 numpy array of %d values: %r" % (len(xyz), density))
else:
    # Cubic Spline, 3D: W(r, h) = 1 / (pi h^3) w(r / h), w(q) = 1 - 1.5 q^2 + 0.75 q^3 (q < 1),
    # 0.25 (2 - q)^3 (1 <= q < 2), 0 beyond (vtkSPHCubicKernel).
    radius = f.GetRadius()
    h = radius / 2.0
    sample = np.random.default_rng(1).choice(len(xyz), size=min(400, len(xyz)), replace=False)
    expected = np.empty(len(sample))
    for k in range(0, len(sample), 20):
        rows = sample[k:k + 20]
        d = xyz[rows, None, :] - xyz[None, :, :]
        q = np.sqrt((d[..., 0] * d[..., 0] + d[..., 1] * d[..., 1]) + d[..., 2] * d[..., 2]) / h
        w = np.where(q < 1.0, 1.0 - 1.5 * q * q + 0.75 * q * q * q,
                     np.where(q < 2.0, 0.25 * (2.0 - np.minimum(q, 2.0)) ** 3, 0.0))
        expected[k:k + len(rows)] = w.sum(axis=1) / (math.pi * h ** 3)
    error = np.abs(density[sample] - expected) / expected
    if not error.max() <= 1e-5:
        failures.append("density differs from the double brute force by up to %.3g relative (point %d)"
                        % (error.max(), sample[int(error.argmax())]))
    if not np.all(np.isfinite(density)) or not np.all(density >= 1.0 / (math.pi * h ** 3) * (1 - 1e-5)):
        failures.append("density is not finite and at least the point's own term everywhere")
for failure in failures:
    print("FAIL " + failure)
if failures:
    sys.exit(1)
print("ok   the README snippet's density equals the double brute force at %d of %d points "
      "(largest relative difference %.2g, mean density %.4g)" % (len(sample), len(xyz), error.max(), density.mean()))
