// The two ceilings of METHOD.md, measured on the device the benchmark runs on: device-to-device
// copy bandwidth (bytes read + written) and the FP32 rate of a dependent-FMA kernel; and the
// floor of the transfers: pinned host memory to the device and back, at the sizes of the 4M
// row's coordinates (48 MiB) and results (16 MiB), one copy each.
#pragma once

#include <string>

struct RooflineMeasurement
{
  double copyGigabytesPerSecond = 0;
  double fp32Gigaflops = 0;
  double pinnedUploadGigabytesPerSecond = 0;
  double pinnedDownloadGigabytesPerSecond = 0;
  std::string summary;
};

RooflineMeasurement measureRoofline();
