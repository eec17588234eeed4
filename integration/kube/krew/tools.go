//go:build tools

// Package tools names krew, the kubectl plugin manager, so that go.mod keeps its dependencies: the CLI's krew
// manifest and archive are proven by installing them with it.
package tools

import (
	_ "sigs.k8s.io/krew/cmd/krew"
)
