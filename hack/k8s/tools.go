//go:build tools

// Package k8stools records the commands hack/k8s/build.sh builds, so that
// `go mod tidy` in this wrapper module keeps their dependencies. It is not
// part of the ztunnel-go module and is never compiled.
package k8stools

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
