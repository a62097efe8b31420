#!/usr/bin/env bash
# pki.sh: the one-node cluster's CA, serving and client certificates,
# service-account keys and kubeconfigs, with openssl, in $NODE_DIR/pki.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
NODE=$(hostname) IP=$(node_ip)
D=$NODE_DIR/pki; mkdir -p "$D"; cd "$D"
[[ -f ca.crt ]] || openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 30 -subj "/CN=ie-k8s-ca" 2>/dev/null
[[ -f sa.key ]] || { openssl genrsa -out sa.key 2048 2>/dev/null; openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null; }
# cert NAME SUBJECT [SAN] [EKU]
cert() {
  local n=$1 subj=$2 san=${3:-} eku=${4:-clientAuth}
  [[ -f $n.crt ]] && return 0
  openssl req -newkey rsa:2048 -nodes -keyout "$n.key" -out "$n.csr" -subj "$subj" 2>/dev/null
  { echo "basicConstraints=CA:FALSE"; echo "keyUsage=critical,digitalSignature,keyEncipherment"; echo "extendedKeyUsage=$eku"
    [[ -n $san ]] && echo "subjectAltName=$san"; } >"$n.ext"
  openssl x509 -req -in "$n.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -out "$n.crt" -days 30 -extfile "$n.ext" 2>/dev/null
  rm -f "$n.csr" "$n.ext"
}
cert apiserver "/CN=kube-apiserver" "DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost,DNS:$NODE,IP:10.96.0.1,IP:127.0.0.1,IP:$IP" serverAuth
cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"
cert front-proxy-client "/CN=front-proxy-client"
cert admin "/O=system:masters/CN=kubernetes-admin"
cert controller-manager "/CN=system:kube-controller-manager"
cert scheduler "/CN=system:kube-scheduler"
cert kube-proxy "/CN=system:kube-proxy"
cert kubelet "/O=system:nodes/CN=system:node:$NODE"
cert kubelet-serving "/CN=$NODE" "DNS:$NODE,IP:$IP,IP:127.0.0.1" serverAuth
cert metrics-apiserver "/CN=keda-metrics-apiserver" "DNS:keda-metrics-apiserver.keda.svc,DNS:localhost,IP:$IP,IP:127.0.0.1" serverAuth
# kubeconfig NAME CERT
kubeconfig() {
  cat >"$1.kubeconfig" <<YAML
apiVersion: v1
kind: Config
clusters:
- name: ie-k8s
  cluster:
    server: https://$IP:6443
    certificate-authority-data: $(base64 -w0 ca.crt)
users:
- name: $1
  user:
    client-certificate-data: $(base64 -w0 "$2.crt")
    client-key-data: $(base64 -w0 "$2.key")
contexts:
- name: ie-k8s
  context: {cluster: ie-k8s, user: $1}
current-context: ie-k8s
YAML
}
for n in admin controller-manager scheduler kube-proxy kubelet; do kubeconfig "$n" "$n"; done
