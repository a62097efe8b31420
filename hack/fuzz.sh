#!/usr/bin/env bash
# Run every fuzz target for the given time each (default 10s): `make fuzz`
# runs them long, `make test` briefly. Go fuzzes one target per run.
# New failing inputs land in the package's testdata/fuzz and fail the run.
set -euo pipefail
cd "$(dirname "$0")/.."
time=${1:-10s}
for target in pkg/webhook:FuzzStripeVerify pkg/webhook:FuzzStandardVerify pkg/webhook:FuzzGitHubVerify \
  pkg/event:FuzzDecode pkg/event:FuzzDecodeOtherSchemes; do
  pkg=${target%%:*} name=${target##*:}
  echo "fuzz: $name ($time)"
  go test -run='^$' -fuzz="^${name}\$" -fuzztime="$time" "./$pkg"
done
