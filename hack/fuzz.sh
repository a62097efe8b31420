#!/usr/bin/env bash
# Run every fuzz target in the module, one `go test -fuzz` per target (Go
# fuzzes one target per run). Targets are discovered with `go test -list`, so
# a new Fuzz function is run without editing this file.
#
#   hack/fuzz.sh short   count budgets (`-fuzztime Nx`, sized per target):
#                        what `make test` runs. No wall clock is involved, so
#                        a loaded machine makes the run slower, never red.
#   hack/fuzz.sh 3m      a time budget per target: what `make fuzz` runs.
#
# A finding is a failing input written to the package's testdata/fuzz: that
# always fails the run. With a time budget, Go 1.26's fuzz coordinator can
# also fail a target at the -fuzztime boundary with a bare "context deadline
# exceeded" and no input written (golang/go#75804, fixed in Go 1.27): that
# is reported as such and does not fail the run. Any other failure does.
set -euo pipefail
cd "$(dirname "$0")/.."
budget=${1:-short}

# Executions per target in the short run: about 2-5 s each on an idle
# 2-core machine (20-25k execs/s). Targets not listed get the default.
declare -A count=(
  [FuzzDecode]=80000x
  [FuzzDecodeOtherSchemes]=60000x
  [FuzzStripeVerify]=60000x
  [FuzzStandardVerify]=60000x
  [FuzzGitHubVerify]=60000x
  # PayPal (pkg/internal/event, pkg/internal/provider/paypal). The verifier
  # is slower per input: some inputs reach the certificate download (a
  # closed loopback port), so it gets fewer.
  [FuzzDecodePayPal]=80000x
  [FuzzPayPalVerify]=20000x
  [FuzzParseChain]=50000x
)
default_count=50000x

case $budget in
short) mode=count ;;
*[0-9]x) echo "fuzz: give 'short' for count budgets or a duration such as 3m, not $budget" >&2; exit 2 ;;
*) mode=time ;;
esac

targets=$(go list -f '{{if or .TestGoFiles .XTestGoFiles}}{{.Dir}}{{end}}' ./... |
  while read -r dir; do
    rel=${dir#"$PWD"/}
    grep -lE '^func Fuzz[A-Za-z0-9_]*\(f \*testing\.F\)' "$dir"/*_test.go >/dev/null 2>&1 || continue
    go test -list '^Fuzz' "./$rel" | grep -E '^Fuzz' | sed "s#^#$rel:#"
  done)
[[ -n $targets ]] || { echo "fuzz: no fuzz targets found" >&2; exit 1; }

failed=0
for target in $targets; do
  pkg=${target%%:*} name=${target##*:}
  if [[ $mode == count ]]; then t=${count[$name]:-$default_count}; else t=$budget; fi
  corpus="$pkg/testdata/fuzz/$name"
  before=$(ls "$corpus" 2>/dev/null | sort || true)
  echo "fuzz: $name ($pkg, $t)"
  log=$(mktemp)
  if go test -run='^$' -fuzz="^${name}\$" -fuzztime="$t" "./$pkg" >"$log" 2>&1; then
    tail -1 "$log"; rm -f "$log"; continue
  fi
  after=$(ls "$corpus" 2>/dev/null | sort || true)
  new=$(comm -13 <(echo "$before") <(echo "$after"))
  if [[ $mode == time && -z $new ]] && ! grep -q 'Failing input written to' "$log" &&
    grep -qE '^[[:space:]]*context deadline exceeded$' "$log" && ! grep -qE '^\s+(panic|.*_test\.go:[0-9]+:)' "$log"; then
    echo "fuzz: $name: the fuzz coordinator stopped with a bare 'context deadline exceeded' at the -fuzztime boundary"
    echo "      and wrote no input (golang/go#75804): not a finding"
    rm -f "$log"; continue
  fi
  cat "$log"; rm -f "$log"
  [[ -n $new ]] && echo "fuzz: $name: new failing input(s) in $corpus: $new" >&2
  failed=1
done
exit $failed
