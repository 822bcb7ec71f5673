//go:build tools

// Package conformancetools records the commands this module builds (the echo
// server and client of the suite's workload image), so that `go mod tidy`
// keeps their dependencies. It is never compiled.
package conformancetools

import (
	_ "istio.io/istio/pkg/test/echo/cmd/client"
	_ "istio.io/istio/pkg/test/echo/cmd/server"
)
