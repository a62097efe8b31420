#!/usr/bin/env bash
# `make lint`: gofmt, then golangci-lint with the rules in .golangci.yaml.
# golangci-lint is pinned by hack/tools/golangci-lint/go.mod+go.sum and built
# from the Go module proxy into bin/ on first use (again only when the pin or
# the Go version changes; a stamp file beside it records which).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
dir=hack/tools/golangci-lint
out=$root/bin/golangci-lint

unformatted=$(gofmt -l $(git ls-files '*.go'))
if [[ -n $unformatted ]]; then
  echo "lint: gofmt needed:"; echo "$unformatted"; exit 1
fi

want=$(cat "$dir/go.mod" "$dir/go.sum" <(go env GOVERSION) | sha256sum | cut -d' ' -f1)
if [[ ! -x $out || $(cat "$out.stamp" 2>/dev/null) != "$want" ]]; then
  echo "lint: building golangci-lint from $dir (first use)"
  t=$SECONDS
  mkdir -p "$root/bin"
  (cd "$dir" && go build -trimpath -o "$out" github.com/golangci/golangci-lint/v2/cmd/golangci-lint)
  echo "$want" >"$out.stamp"
  echo "lint: built in $((SECONDS - t))s"
fi
"$out" run ./...
