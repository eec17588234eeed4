//go:build tools

// Package tools names the command the harness builds, so that go.mod keeps its dependencies.
package tools

import _ "go.etcd.io/etcd/server/v3"
