// Without CUDA there is no device to measure.
#include "Roofline.h"

RooflineMeasurement measureRoofline()
{
  RooflineMeasurement m;
  m.summary = "not measured: built without CUDA";
  return m;
}
