//go:build tools

// Package helm pins the helm binary the chart's tests render and install with (config/helm).
// A module of its own: helm brings its own k8s.io libraries, at versions the other peers'
// Kubernetes releases must not be moved to.
package helm

import (
	_ "helm.sh/helm/v3/cmd/helm"
)
