//go:build tools

// Package control pins the control plane the deployment scenarios need beyond kube-apiserver:
// kube-controller-manager (the DaemonSet, Deployment and ReplicaSet controllers, and the
// ServiceAccount and root-CA publishers the ServiceAccount admission plugin relies on),
// kube-scheduler (DaemonSet and Deployment pods are bound by it), and kubectl (the user's
// `apply -k`), all from the same k8s.io/kubernetes release as the suite's apiserver and kubelet.
// A module of its own so that adding it did not rebuild the other peers.
package control

import (
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
