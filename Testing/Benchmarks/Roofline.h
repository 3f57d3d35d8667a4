// The two ceilings of METHOD.md, measured on the device the benchmark runs on: device-to-device
// copy bandwidth (bytes read + written) and the FP32 rate of a dependent-FMA kernel.
#pragma once

#include <string>

struct RooflineMeasurement
{
  double copyGigabytesPerSecond = 0;
  double fp32Gigaflops = 0;
  std::string summary;
};

RooflineMeasurement measureRoofline();
