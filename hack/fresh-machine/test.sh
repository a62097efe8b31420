#!/usr/bin/env bash
# test.sh [--worktree] [--keep]: `make dev` on a fresh machine, proved in a
# fresh Debian root (`make fresh-machine`, the fresh-machine stage of
# `make test`). Needs root (debootstrap, mounts, namespaces).
#
# The root is Debian bookworm from debootstrap (minbase, plus what a
# developer has before cloning: git, make, curl, CA certificates), with this
# machine's Go (`go env GOROOT`) mounted read-only at /usr/local/go and no
# RabbitMQ, Redis or PostgreSQL. The repository is cloned into it (HEAD of
# this checkout; --worktree: a snapshot of the working tree, tracked and
# untracked files that are not ignored, for trying uncommitted work), and
# hack/fresh-machine/in-root.sh of that clone runs `make dev` there until the
# README's first example answers 202, then 200 duplicate, and
# `eventsctl verify` says ok; then `make services-down`, `make services`
# again (from the state the first run left) and `make services-down`.
#
# Isolation: everything runs in a mount namespace of its own (every mount
# disappears with it), the root is an overlay on the cached base (the base
# is never written), and `make dev` runs in its own network namespace (only
# a loopback) and PID namespace (whatever it left running dies with it). So
# its RabbitMQ, Redis and PostgreSQL listen on the namespace's 127.0.0.1 and
# cannot see or touch the machine's.
#
# No network inside: what `make dev` would download is fetched beforehand,
# outside the network namespace, and `make dev` then runs offline:
#   - the Debian packages: `apt-get install --download-only` of postgresql,
#     redis-server and rabbitmq-server in the root (with the machine's
#     network), into /var/cache/apt/archives, so that hack/services.sh's
#     `apt-get install` installs from there without a network. It is the
#     real install, from Debian's real packages; only the download is moved.
#   - the Go modules: `go mod download` on this machine into its module
#     cache, mounted read-only in the root with GOPROXY=off.
#
# Cached once per machine in $IE_FRESH_MACHINE_CACHE (default
# ${XDG_CACHE_HOME:-~/.cache}/idempotent-events/fresh-machine):
#   base/      the debootstrap root (rebuilt when its recipe changes)
#   debs/      the root's /var/cache/apt/archives (only newer packages are
#              downloaded again)
#   gocache/   the root's Go build cache (a cold one costs about a minute)
# A run's clone and logs live in runs/<tmp>, and the root's writes in memory,
# all removed at the end (--keep writes the root's changes to runs/<tmp>/upper
# and leaves everything there, to be looked at).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
CACHE=${IE_FRESH_MACHINE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/idempotent-events/fresh-machine}
SUITE=bookworm
# What a developer has before `git clone`; the services are not among them.
INCLUDE=ca-certificates,curl,git,make
PACKAGES=(postgresql redis-server rabbitmq-server)

log() { printf '%s fresh-machine: %s\n' "$(date +%T)" "$*" >&2; }
die() { log "FAIL: $*"; exit 1; }
# report WHAT: a line for the stage table of hack/test.sh.
report() { if [[ -n ${IE_TOOLS_REPORT:-} ]]; then echo "$*" >>"$IE_TOOLS_REPORT"; fi; }

# apt_uri PATTERN: the first archive of this machine's apt sources (deb822 or
# one-line) whose URI matches PATTERN: the Debian mirror, its security archive.
apt_uri() {
  { sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/*.sources 2>/dev/null
    grep -hsE '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list | awk '{print $2}'
  } | tr ' ' '\n' | grep -E "$1" | head -1 || true
}

if [[ ${1:-} == --mounted ]]; then
  shift
  # shellcheck source=hack/fresh-machine/mounted.sh
  source "$HERE/mounted.sh"
  exit
fi

MODE=head KEEP=0
for a in "$@"; do
  case $a in
  --worktree) MODE=worktree ;;
  --keep) KEEP=1 ;;
  *) echo "usage: $0 [--worktree] [--keep]" >&2; exit 2 ;;
  esac
done
[[ $(id -u) -eq 0 ]] || die "needs root (debootstrap, mounts, network and PID namespaces)"
T0=$SECONDS

if ! command -v debootstrap >/dev/null && ! [[ -x /usr/sbin/debootstrap ]]; then
  command -v apt-get >/dev/null || die "debootstrap is not installed (apt-get install debootstrap)"
  log "installing debootstrap (apt-get)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends debootstrap >/dev/null ||
    die "apt-get install debootstrap"
fi
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:$PATH

m=$(apt_uri '/debian/?$')
[[ -n $m ]] || die "no Debian mirror in /etc/apt/sources.list{,.d}: debootstrap needs one"
sec=$(apt_uri '/debian-security/?$')
mkdir -p "$CACHE/debs/partial" "$CACHE/gocache" "$CACHE/runs"

# The base root, once per machine: debootstrap under a lock (two runs at
# once build it once), into base.new, renamed when complete.
recipe="debootstrap --variant=minbase --include=$INCLUDE $SUITE $m; security $sec; v1"
exec 8>"$CACHE/base.lock"
flock 8
if [[ -f $CACHE/base/.recipe && $(cat "$CACHE/base/.recipe") == "$recipe" ]]; then
  log "base root cached ($CACHE/base)"
  report "fresh root cached"
else
  t=$SECONDS
  log "debootstrap $SUITE (minbase + $INCLUDE) from $m: once per machine"
  rm -rf "$CACHE/base.new" "$CACHE/base"
  debootstrap --variant=minbase --include="$INCLUDE" "$SUITE" "$CACHE/base.new" "$m" >"$CACHE/debootstrap.log" 2>&1 ||
    { tail -20 "$CACHE/debootstrap.log" >&2; die "debootstrap (log: $CACHE/debootstrap.log)"; }
  {
    echo "deb $m $SUITE main"
    echo "deb $m $SUITE-updates main"
    if [[ -n $sec ]]; then echo "deb $sec $SUITE-security main"; fi
  } >"$CACHE/base.new/etc/apt/sources.list"
  printf '127.0.0.1\tlocalhost\n::1\t\tlocalhost ip6-localhost ip6-loopback\n' >"$CACHE/base.new/etc/hosts"
  echo fresh >"$CACHE/base.new/etc/hostname"
  # debootstrap's package downloads are not needed again.
  rm -rf "$CACHE/base.new/var/cache/apt/archives/"*.deb
  echo "$recipe" >"$CACHE/base.new/.recipe"
  mv "$CACHE/base.new" "$CACHE/base"
  log "base root built in $((SECONDS - t))s"
  report "fresh root built $((SECONDS - t))s"
fi
flock -u 8

W=$(mktemp -d "$CACHE/runs/run.XXXX")
cleanup() {
  local rc=$?
  if ((KEEP)); then
    log "--keep: the run's files are in $W"
  elif grep -qF " $W" /proc/self/mountinfo; then
    log "something is still mounted under $W: not removing it"
  else
    rm -rf "$W"
  fi
  exit "$rc"
}
trap cleanup EXIT

# What is tested, as a repository to clone: HEAD, or a snapshot commit of the
# working tree. The root clones it from /mnt/origin as a user clones from
# GitHub.
sha=$(git -C "$ROOT" rev-parse HEAD)
if [[ $MODE == head ]]; then
  git clone -q --no-checkout "$ROOT" "$W/origin"
  git -C "$W/origin" checkout -q -B fresh-machine "$sha"
  what="HEAD $(git -C "$ROOT" rev-parse --short HEAD)"
else
  mkdir -p "$W/origin"
  (cd "$ROOT" && git ls-files -z -c -o --exclude-standard --deduplicate |
    tar --null -T - --ignore-failed-read -c 2>/dev/null) | tar -C "$W/origin" -x
  git -C "$W/origin" init -q -b fresh-machine
  git -C "$W/origin" add -A
  git -C "$W/origin" -c user.name=fresh-machine -c user.email=fresh-machine@localhost \
    commit -q -m "working tree of $sha"
  what="the working tree of $(git -C "$ROOT" rev-parse --short HEAD)"
fi
log "testing $what"

# The Go modules the clone needs, into this machine's module cache (a no-op
# when they are there), with this machine's network and proxy.
t=$SECONDS
(cd "$W/origin" && go mod download) || die "go mod download"
log "Go modules in $(go env GOMODCACHE) ($((SECONDS - t))s)"

mkdir -p "$W/root" "$W/logs"
# For mounted.sh, in the mount namespace.
IE_FM_GOROOT=$(go env GOROOT)
IE_FM_GOMODCACHE=$(go env GOMODCACHE)
export IE_FM_CACHE=$CACHE IE_FM_RUN=$W IE_FM_KEEP=$KEEP IE_FM_GOROOT IE_FM_GOMODCACHE IE_FM_PACKAGES="${PACKAGES[*]}"
rc=0
unshare --mount --propagation private -- "$0" --mounted || rc=$?
if ((rc != 0)); then
  log "FAIL after $((SECONDS - T0))s; the logs of the run follow (--keep keeps them, and the root's changes, in $CACHE/runs)"
  for f in "$W"/logs/*.log; do
    [[ -s $f ]] || continue
    echo "--- last lines of $(basename "$f")" >&2
    tail -n 25 "$f" >&2
  done
  exit "$rc"
fi
log "ok in $((SECONDS - T0))s: make dev on a fresh Debian $SUITE brought up PostgreSQL, Redis and RabbitMQ and served the README's first example"
