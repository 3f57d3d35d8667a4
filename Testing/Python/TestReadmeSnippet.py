"""Runs readme_snippet.py (the README's Python example, as printed there) and checks its result.

    PYTHONPATH=<folder of neighborgrid> pvpython TestReadmeSnippet.py readme_snippet.py

The snippet must run as written; its `counts` must be the neighbor counts of its `cloud` (points
within R = 1 in double, the point itself excluded), as a numpy int32 array.
"""
import sys

import numpy as np

path = sys.argv[1]
namespace = {"__name__": "__main__"}
with open(path) as f:
    exec(compile(f.read(), path, "exec"), namespace)

xyz = np.asarray(namespace["cloud"].Points, dtype=np.float64)
d = xyz[:, None, :] - xyz[None, :, :]
expected = ((((d[..., 0] * d[..., 0] + d[..., 1] * d[..., 1]) + d[..., 2] * d[..., 2]) <= 1.0).sum(1) - 1)
counts = namespace["counts"]
failures = []
if not (isinstance(counts, np.ndarray) and counts.dtype == np.int32 and counts.shape == expected.shape):
    failures.append("counts is not an int32 numpy array of %d values: %r" % (len(expected), counts))
elif not np.array_equal(counts, expected):
    failures.append("counts differ from the brute force at %d points" % int((counts != expected).sum()))
if expected.max() == 0:
    failures.append("the snippet's cloud has no neighbors: the check would be vacuous")
for failure in failures:
    print("FAIL " + failure)
if failures:
    sys.exit(1)
print("ok   the snippet's counts equal the double brute force at all %d points (mean %.2f)"
      % (len(expected), expected.mean()))
