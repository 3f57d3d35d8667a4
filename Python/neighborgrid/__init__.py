"""NeighborGrid's VTK filters in Python (the VTK module NeighborGrid::Filters, wrapped).

    from neighborgrid import vtkPointNeighborhoodFilter

The classes are VTK algorithms like those of vtkmodules, built against ParaView's VTK: use them
in pvpython, pvbatch or ParaView's Python shell (not with a separately installed `vtk` wheel).

- vtkPointNeighborhoodFilter: neighbor count, SPH density, kernel smoothing or gradient of a
  point set, written as point arrays ("NeighborCount", "Density", "<name>_smoothed", ...).
- vtkPointNeighborhoodProbe: the same operations at the points of another dataset.
- vtkPointNeighborhoodVolume: the same operations on a regular grid around the particles.

Where it comes from: the package lies in <build or install prefix>/lib/python3.X/dist-packages
(PYTHONPATH, or on sys.path already for an install to /usr/local); loading the ParaView plugin
(LoadPlugin, PV_PLUGIN_PATH) also makes it importable without PYTHONPATH.
"""
from .NeighborGridFilters import (  # noqa: F401 (the package's API)
    vtkPointNeighborhoodFilter,
    vtkPointNeighborhoodProbe,
    vtkPointNeighborhoodVolume,
)

__all__ = ["vtkPointNeighborhoodFilter", "vtkPointNeighborhoodProbe", "vtkPointNeighborhoodVolume"]
