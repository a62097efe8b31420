#!/usr/bin/env bash
# images.sh: every image the cluster runs, built here (no registry is
# reachable), then imported into the node's containerd:
#
#   golang:<GO_VERSION>-bookworm    stand-in: debootstrap's Debian + this machine's Go
#   gcr.io/distroless/static-debian12:nonroot
#                                   stand-in: CA bundle, passwd/group with nonroot 65532
#   docker/dockerfile:1.7           BuildKit's Dockerfile frontend built from the proxy
#   idempotent-events:e2e-1, :e2e-2 the project's Dockerfile, unmodified, twice
#                                   (two VERSIONs: scenario 4 upgrades from one to the other)
#   orders-worker:e2e               examples/orders/Dockerfile: a team's own worker
#   registry.k8s.io/pause:3.10      hack/k8s/cmd/pause
#   ie-k8s/coredns:1.15.0           CoreDNS built from the proxy
#   ghcr.io/kedacore/keda*:main     KEDA's operator, metrics adapter and webhooks
#   docker.io/library/{rabbitmq,redis,postgres}:<the subcharts' tags>
#                                   stand-ins from Debian's packages (hack/k8s/images/)
#
# Base images are kept in the private Docker engine's data root between runs.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
B=$CACHE/build; mkdir -p "$B"
DOCKER=/usr/bin/docker

have() { $DOCKER image inspect "$1" >/dev/null 2>&1; }
# report WHAT: a line for the stage table of hack/test.sh.
report() { if [[ -n ${IE_TOOLS_REPORT:-} ]]; then echo "$*" >>"$IE_TOOLS_REPORT"; fi; }
mirror() {
  local m
  m=$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -1)
  echo "${m:-$(grep -rhoE 'https?://[^ ]+' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null | head -1)}"
}

# Debian bookworm from debootstrap, the base of the stand-ins.
if have ie-k8s/debian:bookworm; then
  report "base images cached"
else
  t0=$SECONDS
  log "debootstrap bookworm (first run only)"
  rm -rf "$B/rootfs"
  debootstrap --variant=minbase bookworm "$B/rootfs" "$(mirror)" >"$B/debootstrap.log" 2>&1 ||
    { tail -20 "$B/debootstrap.log" >&2; die "debootstrap"; }
  # The build containers reach the module proxy through this machine's TLS
  # interception, so they need its CA bundle.
  mkdir -p "$B/rootfs/etc/ssl/certs"
  cp /etc/ssl/certs/ca-certificates.crt "$B/rootfs/etc/ssl/certs/ca-certificates.crt"
  tar -C "$B/rootfs" -c . | $DOCKER import - ie-k8s/debian:bookworm >/dev/null
  rm -rf "$B/rootfs"
  report "base images built $((SECONDS - t0))s"
fi

# golang:<the Dockerfile's GO_VERSION>-bookworm: this machine's Go on that Debian.
gov=$(sed -n 's/^ARG GO_VERSION=//p' "$ROOT/Dockerfile")
[[ $(go env GOVERSION) == "go$gov" ]] || die "the Dockerfile builds with Go $gov, this machine has $(go env GOVERSION)"
if ! have "golang:$gov-bookworm"; then
  rm -rf "$B/golang"; mkdir -p "$B/golang"
  cp -a "$(go env GOROOT)" "$B/golang/go"
  cat >"$B/golang/Dockerfile" <<DF
FROM ie-k8s/debian:bookworm
COPY go /usr/local/go
ENV PATH=/usr/local/go/bin:/go/bin:\$PATH GOPATH=/go GOTOOLCHAIN=local GOPROXY=$(go env GOPROXY) GOSUMDB=$(go env GOSUMDB)
WORKDIR /go
DF
  $DOCKER build -q -t "golang:$gov-bookworm" "$B/golang" >/dev/null
  rm -rf "$B/golang"
fi

if ! have gcr.io/distroless/static-debian12:nonroot; then
  d=$B/distroless; rm -rf "$d"; mkdir -p "$d/rootfs/etc/ssl/certs" "$d/rootfs/home/nonroot" "$d/rootfs/tmp"
  cp /etc/ssl/certs/ca-certificates.crt "$d/rootfs/etc/ssl/certs/"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$d/rootfs/etc/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' >"$d/rootfs/etc/group"
  printf 'FROM scratch\nCOPY rootfs/ /\nUSER 65532:65532\n' >"$d/Dockerfile"
  $DOCKER build -q -t gcr.io/distroless/static-debian12:nonroot "$d" >/dev/null
fi

# scratch image NAME:TAG BINARY ENTRYPOINT_PATH
scratch_image() {
  local tag=$1 bin=$2 path=$3 d=$B/scratch-${1//[\/:]/_}
  rm -rf "$d"; mkdir -p "$d"; cp "$bin" "$d/bin"
  printf 'FROM scratch\nCOPY bin %s\nENTRYPOINT ["%s"]\n' "$path" "$path" >"$d/Dockerfile"
  $DOCKER build -q -t "$tag" "$d" >/dev/null
}
syntax=$(sed -n 's/^# syntax=//p' "$ROOT/Dockerfile")
scratch_image "$syntax" "$BIN/dockerfile-frontend" /bin/dockerfile-frontend
scratch_image registry.k8s.io/pause:3.10 "$BIN/pause" /pause
scratch_image ie-k8s/coredns:1.15.0 "$BIN/coredns" /coredns

# The project's image: the Dockerfile as it is, context = the repository
# (.dockerignore keeps it to go.mod, go.sum, cmd/, pkg/, migrations/).
# --network host: the build's `go mod download` reaches the module proxy
# without the engine's bridge and NAT rules.
for v in e2e-1 e2e-2; do
  DOCKER_BUILDKIT=1 $DOCKER build -q --network host --build-arg "VERSION=$v" \
    --build-arg "REVISION=$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)" \
    -t "idempotent-events:$v" "$ROOT" >/dev/null || die "docker build of the project's Dockerfile"
done
# A team's own worker (examples/orders), which the chart runs by image
# override alone (scenario 7).
DOCKER_BUILDKIT=1 $DOCKER build -q --network host -f "$ROOT/examples/orders/Dockerfile" --build-arg VERSION=e2e-orders \
  -t orders-worker:e2e "$ROOT" >/dev/null || die "docker build of examples/orders/Dockerfile"
$DOCKER run --rm --entrypoint /usr/local/bin/receiver idempotent-events:e2e-2 --version | grep -q e2e-2 ||
  die "the built image does not report its VERSION"

# KEDA's three images, as its manifests name them, from the binaries built
# by tools.sh (scenario 3). The manifests in the module (config/, what
# scenario 3 applies) name the tag main; the binaries are v2.21.0's.
keda=()
if [[ -x $BIN/operator ]]; then
  for spec in operator:keda:/keda adapter:keda-metrics-apiserver:/keda-adapter webhooks:keda-admission-webhooks:/keda-admission-webhooks; do
    IFS=: read -r bin name path <<<"$spec"
    d=$B/keda-$name; rm -rf "$d"; mkdir -p "$d"; cp "$BIN/$bin" "$d/bin"
    printf 'FROM gcr.io/distroless/static-debian12:nonroot\nCOPY bin %s\nENTRYPOINT ["%s"]\n' "$path" "$path" >"$d/Dockerfile"
    $DOCKER build -q -t "ghcr.io/kedacore/$name:main" "$d" >/dev/null
    keda+=("ghcr.io/kedacore/$name:main")
  done
fi

# Stand-ins for the subcharts' official images (scenario 2).
stand_ins=()
for d in "$ROOT"/hack/k8s/images/*/; do
  [[ -f $d/Dockerfile ]] || continue
  tag=$(sed -n 's/^# image: //p' "$d/Dockerfile")
  DOCKER_BUILDKIT=1 $DOCKER build -q --network host -t "$tag" "$d" >/dev/null || die "stand-in $tag"
  stand_ins+=("$tag")
done

tags=(idempotent-events:e2e-1 idempotent-events:e2e-2 orders-worker:e2e registry.k8s.io/pause:3.10 ie-k8s/coredns:1.15.0 "${keda[@]}" "${stand_ins[@]}")
$DOCKER save "${tags[@]}" | "${CTR[@]}" images import - >/dev/null
log "images: ${tags[*]} imported into the node"
