#!/usr/bin/env bash
# node-down.sh: stop everything node-up.sh, host-services and the scenarios
# started, by PID file, after the pods are gone; remove the node's iptables
# chains, mounts and bridge, and put back the sysctls the kubelet and
# kube-proxy change. The machine's own RabbitMQ, Redis and PostgreSQL are
# not touched (their scenario databases and vhosts are dropped by e2e.sh).
set -uo pipefail
source "$(dirname "$0")/lib.sh"
if kubectl get --raw /readyz >/dev/null 2>&1; then
  for ns in $(kubectl get ns -o name | cut -d/ -f2 | grep -vxE 'default|kube-system|kube-public|kube-node-lease'); do
    kubectl delete ns "$ns" --wait=false >/dev/null 2>&1
  done
  kubectl delete deploy,statefulset,job,pod,apiservice --all -A --wait=false >/dev/null 2>&1
  for _ in $(seq 1 60); do [[ -z $(kubectl get pods -A -o name 2>/dev/null) ]] && break; sleep 1; done
fi
for n in keda-adapter keda-operator kube-proxy kubelet kube-scheduler kube-controller-manager kube-apiserver etcd; do stop "$n"; done
for f in "$NODE_DIR"/run/socat-*.pid; do [[ -f $f ]] && stop "$(basename "$f" .pid)"; done
# Sandboxes left behind: their shims are children of the node's containerd.
if "${CTR[@]}" version >/dev/null 2>&1; then
  for t in $("${CTR[@]}" tasks ls -q 2>/dev/null); do
    "${CTR[@]}" tasks kill -s SIGKILL "$t" >/dev/null 2>&1; sleep 0.2; "${CTR[@]}" tasks delete "$t" >/dev/null 2>&1
  done
fi
stop containerd
pkill -f "containerd-shim-runc-v2 -namespace k8s.io -address $RUN_DIR/containerd/containerd.sock" 2>/dev/null
[[ -x $BIN/kube-proxy ]] && "$BIN/kube-proxy" --cleanup >/dev/null 2>&1
# Mounts under the node's directories and the kubelet's defaults, deepest first.
grep -oE " ($NODE_DIR|$RUN_DIR|/var/lib/kubelet)/[^ ]*" /proc/mounts | sort -r | xargs -r -n1 umount 2>/dev/null
ip link del "$BRIDGE" 2>/dev/null
# Chains the kubelet and the CNI firewall plugin leave (kube-proxy --cleanup took its own).
for tb in filter nat mangle; do
  iptables-save -t $tb | grep -E '^-A ' | grep -vE '^-A (KUBE-|CNI-)' | grep -E ' -j (KUBE-|CNI-)' | sed 's/^-A /-D /' |
    while read -r rule; do eval "iptables -t $tb $rule"; done
  for ch in $(iptables-save -t $tb | sed -n 's/^:\(KUBE-[^ ]*\|CNI-[^ ]*\) .*/\1/p'); do iptables -t $tb -F "$ch"; done
  for ch in $(iptables-save -t $tb | sed -n 's/^:\(KUBE-[^ ]*\|CNI-[^ ]*\) .*/\1/p'); do iptables -t $tb -X "$ch" 2>/dev/null; done
done
# Sysctls the kubelet and kube-proxy set, back to what node-up.sh recorded.
if [[ -f $NODE_DIR/sysctl.saved ]]; then
  while read -r k v; do sysctl -qw "$k=$v" 2>/dev/null; done <"$NODE_DIR/sysctl.saved"
  rm -f "$NODE_DIR/sysctl.saved"
fi
rm -rf /var/lib/kubelet /var/log/pods /var/log/containers /var/lib/cni/networks/ie-k8s-pods 2>/dev/null
exit 0
