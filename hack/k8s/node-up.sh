#!/usr/bin/env bash
# node-up.sh: a one-node Kubernetes from host processes: containerd (Debian's)
# with runc and the CNI bridge plugins, etcd, kube-apiserver, -controller-
# manager, -scheduler, kubelet and kube-proxy (iptables mode), all built by
# tools.sh. Pods get $POD_CIDR on bridge $BRIDGE, Services $SERVICE_CIDR.
# Each daemon's PID is in $NODE_DIR/run, its log in $NODE_DIR/log.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
NODE=$(hostname) IP=$(node_ip)
P=$NODE_DIR/pki
mkdir -p "$NODE_DIR"/{etc,cni,etcd,kubelet,containerd} "$RUN_DIR"

# restrict_oom_score_adj: this kind of machine withholds CAP_SYS_RESOURCE, so
# runc cannot give the sandbox its oom_score_adj of -998 ("can't get final
# child's PID from pipe: EOF" otherwise).
cat >"$NODE_DIR/etc/containerd.toml" <<TOML
version = 2
root = "$NODE_DIR/containerd"
state = "$RUN_DIR/containerd-state"
[grpc]
  address = "$RUN_DIR/containerd/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.10"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$NODE_DIR/cni"
TOML
# The firewall plugin keeps pod traffic flowing when a Docker engine with
# iptables has set FORWARD to DROP.
cat >"$NODE_DIR/cni/10-ie-k8s.conflist" <<JSON
{"cniVersion": "1.0.0", "name": "ie-k8s-pods", "plugins": [
  {"type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": true, "hairpinMode": true,
   "ipam": {"type": "host-local", "dataDir": "$NODE_DIR/cni-ipam", "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$GATEWAY"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
  {"type": "portmap", "capabilities": {"portMappings": true}},
  {"type": "firewall"}]}
JSON
# The bridge exists before the first pod, so services can bind its gateway IP.
ip link show "$BRIDGE" >/dev/null 2>&1 || { ip link add "$BRIDGE" type bridge; ip addr add "$GATEWAY/24" dev "$BRIDGE"; }
ip link set "$BRIDGE" up
# Record the sysctls the kubelet and kube-proxy change, for node-down.sh.
if [[ ! -f $NODE_DIR/sysctl.saved ]]; then
  for k in vm.overcommit_memory kernel.panic kernel.panic_on_oops net.ipv4.conf.all.route_localnet \
    net.netfilter.nf_conntrack_tcp_timeout_established net.netfilter.nf_conntrack_tcp_timeout_close_wait net.ipv4.ip_forward; do
    v=$(sysctl -n "$k" 2>/dev/null) && echo "$k $v"
  done >"$NODE_DIR/sysctl.saved"
fi
sysctl -qw net.ipv4.ip_forward=1

start containerd containerd --config "$NODE_DIR/etc/containerd.toml"
wait_for containerd 30 "${CTR[@]}" version
start etcd etcd --name ie-k8s --data-dir "$NODE_DIR/etcd" \
  --listen-client-urls http://127.0.0.1:23790 --advertise-client-urls http://127.0.0.1:23790 \
  --listen-peer-urls http://127.0.0.1:23800 --initial-advertise-peer-urls http://127.0.0.1:23800 \
  --initial-cluster ie-k8s=http://127.0.0.1:23800 --listen-metrics-urls http://127.0.0.1:23810 \
  --quota-backend-bytes 2147483648 --unsafe-no-fsync
wait_for etcd 30 curl -fsS http://127.0.0.1:23810/health
start kube-apiserver kube-apiserver --advertise-address "$IP" --secure-port 6443 \
  --etcd-servers http://127.0.0.1:23790 --service-cluster-ip-range "$SERVICE_CIDR" \
  --tls-cert-file "$P/apiserver.crt" --tls-private-key-file "$P/apiserver.key" --client-ca-file "$P/ca.crt" \
  --kubelet-client-certificate "$P/apiserver-kubelet-client.crt" --kubelet-client-key "$P/apiserver-kubelet-client.key" \
  --kubelet-certificate-authority "$P/ca.crt" --kubelet-preferred-address-types InternalIP,Hostname \
  --service-account-issuer https://kubernetes.default.svc.cluster.local --service-account-key-file "$P/sa.pub" \
  --service-account-signing-key-file "$P/sa.key" --authorization-mode Node,RBAC --allow-privileged=true \
  --enable-admission-plugins NodeRestriction \
  --requestheader-client-ca-file "$P/ca.crt" --requestheader-allowed-names front-proxy-client \
  --requestheader-username-headers X-Remote-User --requestheader-group-headers X-Remote-Group \
  --requestheader-extra-headers-prefix X-Remote-Extra- \
  --proxy-client-cert-file "$P/front-proxy-client.crt" --proxy-client-key-file "$P/front-proxy-client.key" \
  --enable-aggregator-routing=true
wait_for kube-apiserver 120 kubectl get --raw /readyz || { tail -20 "$NODE_DIR/log/kube-apiserver.log" >&2; exit 1; }
start kube-controller-manager kube-controller-manager --kubeconfig "$P/controller-manager.kubeconfig" \
  --authentication-kubeconfig "$P/controller-manager.kubeconfig" --authorization-kubeconfig "$P/controller-manager.kubeconfig" \
  --service-account-private-key-file "$P/sa.key" --root-ca-file "$P/ca.crt" --use-service-account-credentials \
  --cluster-signing-cert-file "$P/ca.crt" --cluster-signing-key-file "$P/ca.key" \
  --service-cluster-ip-range "$SERVICE_CIDR" --leader-elect=false --bind-address 127.0.0.1 --secure-port 10357 \
  --horizontal-pod-autoscaler-sync-period 5s
start kube-scheduler kube-scheduler --kubeconfig "$P/scheduler.kubeconfig" \
  --authentication-kubeconfig "$P/scheduler.kubeconfig" --authorization-kubeconfig "$P/scheduler.kubeconfig" \
  --leader-elect=false --bind-address 127.0.0.1 --secure-port 10359
# cgroup v1 here: kubelet 1.37 refuses it unless failCgroupV1 is false.
cat >"$NODE_DIR/etc/kubelet.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $P/ca.crt}
authorization: {mode: Webhook}
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://$RUN_DIR/containerd/containerd.sock
clusterDNS: [$DNS_IP]
clusterDomain: cluster.local
tlsCertFile: $P/kubelet-serving.crt
tlsPrivateKeyFile: $P/kubelet-serving.key
resolvConf: /etc/resolv.conf
port: 10250
healthzPort: 10258
serializeImagePulls: false
imageGCHighThresholdPercent: 100
evictionHard: {memory.available: "200Mi", nodefs.available: "2%", imagefs.available: "2%"}
YAML
start kubelet kubelet --config "$NODE_DIR/etc/kubelet.yaml" --kubeconfig "$P/kubelet.kubeconfig" \
  --root-dir "$NODE_DIR/kubelet" --hostname-override "$NODE" --node-ip "$IP"
wait_for "node Ready" 120 sh -c "kubectl get node $NODE -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -qx True" ||
  { tail -20 "$NODE_DIR/log/kubelet.log" >&2; exit 1; }
start kube-proxy kube-proxy --kubeconfig "$P/kube-proxy.kubeconfig" --hostname-override "$NODE" \
  --cluster-cidr 10.244.0.0/16 --proxy-mode iptables --conntrack-max-per-core 0 \
  --metrics-bind-address 127.0.0.1:10249 --healthz-bind-address 127.0.0.1:10256
wait_for kube-proxy 60 curl -fsS http://127.0.0.1:10256/healthz
