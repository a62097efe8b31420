#!/usr/bin/env bash
# Install what the one-node cluster needs from Debian's packages, if missing:
# containerd and runc run the pods, the CNI plugins wire them, docker.io builds
# the images (with the project's own Dockerfile), debootstrap makes the base
# images, iptables and conntrack serve kube-proxy, socat exposes the
# machine's services to the pods, psql and redis-cli prepare them.
set -euo pipefail
need=()
# command:package
for cp in dockerd:docker.io containerd:containerd runc:runc /usr/lib/cni/bridge:containernetworking-plugins \
  debootstrap:debootstrap iptables:iptables conntrack:conntrack socat:socat openssl:openssl curl:curl \
  psql:postgresql-client redis-cli:redis-tools ip:iproute2; do
  c=${cp%%:*}
  [[ -x $c ]] || PATH=/usr/sbin:/sbin:$PATH command -v "$c" >/dev/null || need+=("${cp#*:}")
done
[[ ${#need[@]} -eq 0 ]] && exit 0
[[ $(id -u) -eq 0 ]] || { echo "k8s deps: installing ${need[*]} needs root" >&2; exit 1; }
echo "k8s deps: apt-get install ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get install -y --no-install-recommends "${need[@]}" >/dev/null ||
  { apt-get update >/dev/null && apt-get install -y --no-install-recommends "${need[@]}" >/dev/null; }
