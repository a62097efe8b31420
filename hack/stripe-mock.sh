#!/usr/bin/env bash
# Builds Stripe's stripe-mock into bin/stripe-mock for the reconciler's
# contract test (pkg/internal/reconcile/stripemock_test.go) and prints its
# path. stripe-mock is pinned by hack/tools/stripe-mock/go.mod+go.sum and
# built from the Go module proxy on first use (again only when the pin or
# the Go version changes; a stamp file beside it records which).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
dir=hack/tools/stripe-mock
out=$root/bin/stripe-mock
export GOWORK=off

version=$(awk '$1 == "github.com/stripe/stripe-mock" { print $2 }' "$dir/go.mod")
want=$(cat "$dir/go.mod" "$dir/go.sum" <(go env GOVERSION) | sha256sum | cut -d' ' -f1)
if [[ ! -x $out || $(cat "$out.stamp" 2>/dev/null) != "$want" ]]; then
  echo "stripe-mock: building $version from $dir" >&2
  t=$SECONDS
  mkdir -p "$root/bin"
  # -X main.version as stripe-mock's own release build sets it (-version).
  (cd "$dir" && CGO_ENABLED=0 go build -trimpath -ldflags "-X main.version=${version#v}" \
    -o "$out" github.com/stripe/stripe-mock)
  echo "$want" >"$out.stamp"
  echo "stripe-mock: built in $((SECONDS - t))s" >&2
fi
echo "$out"
