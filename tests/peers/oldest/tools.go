//go:build tools

// Package oldest pins the oldest Kubernetes minor the project claims (see docs/compatibility.md):
// the kube-apiserver the admission scenarios and the kubelet the node scenarios run against a
// second time, and the kube-controller-manager beside them (upstream's version skew policy allows
// no controller-manager newer than its apiserver), from k8s.io/kubernetes at that minor. etcd,
// csi-sanity and the test programs are the newest set's.
// A module of its own: one k8s.io/kubernetes release per module.
package oldest

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
