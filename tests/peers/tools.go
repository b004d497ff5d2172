//go:build tools

// Package peers pins the real Kubernetes components the tests run against, built from the Go
// module proxy with the machine's Go toolchain: csi-sanity (the CSI driver's conformance suite),
// and, for the end-to-end suite, kube-apiserver and etcd.
package peers

import (
	_ "github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity"
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
)
