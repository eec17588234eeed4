#!/usr/bin/env bash
# Pins the Kubernetes and etcd releases the harness builds: writes kubernetes/go.mod and etcd/go.mod
# (plus go.sum) for KUBERNETES_VERSION, with the etcd server release that Kubernetes itself uses.
#
#   integration/kube/pin.sh v1.36.3
#
# k8s.io/kubernetes replaces each staging module (k8s.io/api, k8s.io/client-go, ...) with a local path,
# which `go install` refuses; our module requires it and points each staging module at its published
# v0.X.Y release instead.
set -euo pipefail
version=${1:?usage: pin.sh vX.Y.Z}
here=$(cd "$(dirname "$0")" && pwd)
staging=v0.${version#v1.}

modfile=$(cd "$here/kubernetes" && go mod download -json "k8s.io/kubernetes@$version" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
{
  echo "module sealion.dev/integration/kube/kubernetes"
  echo
  echo "go $(sed -n 's/^go \(.*\)/\1/p' "$modfile")"
  echo
  echo "require k8s.io/kubernetes $version"
  echo
  echo "replace ("
  grep -E '=> \./staging/' "$modfile" | awk -v v="$staging" '{print "\t" $1 " => " $1 " " v}'
  echo ")"
} > "$here/kubernetes/go.mod"
(cd "$here/kubernetes" && go mod tidy)

etcd=$(cd "$here/kubernetes" && go list -m -f '{{.Version}}' go.etcd.io/etcd/client/v3)
cat > "$here/etcd/go.mod" <<MOD
module sealion.dev/integration/kube/etcd

go 1.24

require go.etcd.io/etcd/server/v3 $etcd
MOD
(cd "$here/etcd" && go mod tidy)
echo "pinned kubernetes $version, etcd $etcd"
