//go:build tools

// Package tools names Helm 3, which the chart tests run beside Helm 4 (most clusters are still driven by Helm 3),
// so that go.mod keeps its dependencies.
package tools

import (
	_ "helm.sh/helm/v3/cmd/helm"
)
