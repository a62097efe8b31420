#!/usr/bin/env bash
# `make lint`: gofmt, then golangci-lint with the rules in .golangci.yaml.
# golangci-lint is pinned by hack/tools/golangci-lint/go.mod+go.sum and built
# from the Go module proxy by hack/tools/build.sh on first use (again only
# when the pin or the Go version changes).
set -euo pipefail
cd "$(dirname "$0")/.."

unformatted=$(gofmt -l $(git ls-files '*.go'))
if [[ -n $unformatted ]]; then
  echo "lint: gofmt needed:"; echo "$unformatted"; exit 1
fi

# The pinned golangci-lint (hack/tools/golangci-lint), from the tools cache
# shared by every checkout (hack/tools/build.sh builds it on first use).
hack/tools/build.sh golangci-lint
out=$(hack/tools/build.sh --dir)/golangci-lint
"$out" run ./...
