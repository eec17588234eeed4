//go:build tools

// Package tools names the cluster DNS server the development nodes run, so that go.mod keeps its dependencies.
package tools

import (
	_ "github.com/coredns/coredns"
)
