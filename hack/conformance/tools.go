//go:build tools

// This file records the commands this module builds (the echo server and
// client of the suite's workload image), so that `go mod tidy` keeps their
// dependencies. Its build tag keeps it out of every build.
package conformance

import (
	_ "istio.io/istio/pkg/test/echo/cmd/client"
	_ "istio.io/istio/pkg/test/echo/cmd/server"
)
