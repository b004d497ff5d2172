//go:build tools

// Package node pins the real node the end-to-end suite runs pods on: kubelet, from the same
// k8s.io/kubernetes release as the suite's kube-apiserver. It is a module of its own because
// csi-test (in the parent module) needs a newer CSI spec than kubelet compiles against.
package node

import (
	_ "k8s.io/kubernetes/cmd/kubelet"
)
