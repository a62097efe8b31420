#!/usr/bin/env bash
# Builds Stripe's stripe-mock into bin/stripe-mock for the reconciler's
# contract test (pkg/internal/reconcile/stripemock_test.go) and prints its
# path. stripe-mock is pinned by hack/tools/stripe-mock/go.mod+go.sum and
# built from the Go module proxy by hack/tools/build.sh on first use (again
# only when the pin or the Go version changes).
set -euo pipefail
cd "$(dirname "$0")/.."
# Built into the tools cache shared by every checkout; bin/stripe-mock is a
# link to it, where the test looks by default.
hack/tools/build.sh stripe-mock >&2
mkdir -p bin
ln -sfn "$(hack/tools/build.sh --dir)/stripe-mock" bin/stripe-mock
echo "$PWD/bin/stripe-mock"
