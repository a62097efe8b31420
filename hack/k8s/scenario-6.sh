# shellcheck shell=bash
# Scenario 6, sourced by e2e.sh: `tilt ci` on the Tiltfile needs a tilt
# binary, and Tilt is only distributed as release archives and from GitHub,
# neither reachable here; the module proxy is asked each run, so the line
# says what it answered today. (The Tiltfile itself is checked offline by
# hack/deploytest/tilt_test.go.)
t=$SECONDS
if answer=$(cd "$ROOT/hack/tools/k8s" && GOFLAGS=-mod=mod go list -m -versions github.com/tilt-dev/tilt 2>&1); then
  result 6 tilt "FAIL: the module proxy now serves Tilt ($answer): build it in tools.sh and run tilt ci here"
elif code=$(grep -o ': [45][0-9][0-9] [A-Za-z ]*' <<<"$answer" | head -1 | sed 's/^: //; s/ *$//') && [[ -n $code ]]; then
  result 6 tilt "not run: the module proxy refuses github.com/tilt-dev/tilt ($code), and no Tilt release archive is reachable"
else
  result 6 tilt "FAIL: could not ask the module proxy for Tilt: $answer"
fi
