#!/usr/bin/env bash
# Runs the GUI test's command line ("$@": xvfb-run ... paraview --test-script=... --exit) and
# passes only when all of these hold, so that a client that played nothing cannot pass:
# - it exits 0 (ParaView: the playback succeeded and the image is within the threshold);
# - the view script reported the three filters' outputs (it ran, on the pipeline the XML built);
# - ParaView reported an image error (the comparison with the baseline took place).
set -u
log=$(mktemp)
trap 'rm -f "$log"' EXIT
"$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
status=0
if [ "$rc" -ne 0 ]; then
  echo "RunGUITest: the client exited with $rc"
  status=1
fi
for name in PointNeighborhood1 PointNeighborhoodProbe1 PointNeighborhoodVolume1; do
  if ! grep -q "^TestNeighborGridGUI: $name: [1-9][0-9]* points" "$log"; then
    echo "RunGUITest: no report of $name with points from the view script"
    status=1
  fi
done
if grep -q "^TestNeighborGridGUI: FAIL" "$log"; then
  status=1
fi
error=$(grep -o '<DartMeasurement name="ImageError" type="numeric/double">[^<]*' "$log" | sed 's/.*>//')
if [ -z "$error" ]; then
  echo "RunGUITest: no image comparison took place"
  status=1
else
  echo "RunGUITest: image error $error"
fi
exit $status
