import numpy as np
from vtkmodules.numpy_interface import dataset_adapter as dsa
from vtkmodules.vtkCommonDataModel import vtkPolyData
from neighborgrid import vtkPointNeighborhoodFilter

cloud = dsa.WrapDataObject(vtkPolyData())
cloud.Points = np.random.default_rng(0).uniform(0.0, 10.0, size=(1000, 3))  # numpy in
f = vtkPointNeighborhoodFilter()
f.SetInputData(cloud.VTKObject); f.SetOperation(f.NEIGHBOR_COUNT); f.SetRadius(1.0); f.Update()
counts = dsa.WrapDataObject(f.GetOutput()).PointData["NeighborCount"]  # numpy out, int32
print(counts[:8], counts.mean())
