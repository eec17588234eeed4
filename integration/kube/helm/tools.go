//go:build tools

// Package tools names Helm, which the chart tests install Sealion's charts with, so that go.mod keeps its
// dependencies.
package tools

import (
	_ "helm.sh/helm/v4/cmd/helm"
)
