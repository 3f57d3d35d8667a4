"""Minimal pvpython example of the NeighborGrid plugin (CTest runs it).

    pvpython point_neighborhood_example.py path/to/NeighborGrid.so [Data/popc-membrane.vtp]

Loads the plugin, reads the sample membrane (atoms of POPC lipids and water, angstrom) and uses
Point Neighborhood twice: the SPH density of the atoms' masses, then Kernel Smoothing of the
0/1 point array 'water', which gives every atom the local fraction of water around it. Prints what
it finds and exits non-zero if the numbers are not what a membrane in water must give.
"""
import os
import sys

import numpy as np
from paraview.simple import LoadPlugin, XMLPolyDataReader
from vtkmodules.util.numpy_support import vtk_to_numpy

plugin = sys.argv[1]
data = sys.argv[2] if len(sys.argv) > 2 else os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "Data", "popc-membrane.vtp")

LoadPlugin(plugin, ns=globals())  # defines PointNeighborhood here
atoms = XMLPolyDataReader(FileName=[data])

# 1. Mass density (Da per cubic angstrom) with an 8 A support radius.
density = PointNeighborhood(Input=atoms)  # noqa: F821
density.Operation = "Density"
density.Radius = 8.0
density.MassArray = ["POINTS", "mass"]

# 2. Local water fraction: Shepard-normalized smoothing of the 0/1 array 'water'.
water = PointNeighborhood(Input=density)  # noqa: F821
water.Operation = "Kernel Smoothing"
water.Radius = 8.0
water.Kernel = "Wendland C2"
water.SmoothedArrays = ["water"]
water.Normalization = "Shepard"
water.UpdatePipeline()

out = water.GetClientSideObject().GetOutputDataObject(0)
pd = out.GetPointData()
rho = vtk_to_numpy(pd.GetArray("Density"))
fraction = vtk_to_numpy(pd.GetArray("water_smoothed"))
is_water = vtk_to_numpy(pd.GetArray("water")) > 0.5
z = vtk_to_numpy(out.GetPoints().GetData())[:, 2]

# The bilayer's hydrocarbon core is the middle of the box along z (the membrane normal).
core = ~is_water & (np.abs(z - np.median(z[~is_water])) < 5.0)
print("points                 %d" % out.GetNumberOfPoints())
print("mass density           median %.3f Da/A^3 (%.3f g/cm^3)" % (
    np.median(rho), np.median(rho) * 1.66054))
print("water fraction         water atoms %.2f, lipid core atoms %.2f" % (
    np.median(fraction[is_water]), np.median(fraction[core])))

ok = (0.3 < np.median(rho) < 0.9                      # liquids: 0.5 - 0.6 Da/A^3
      and np.all((fraction >= -1e-6) & (fraction <= 1 + 1e-6))  # Shepard: a weighted average
      and np.median(fraction[is_water]) > 0.8
      and np.median(fraction[core]) < 0.05)
print("OK" if ok else "UNEXPECTED RESULT")
sys.exit(0 if ok else 1)
