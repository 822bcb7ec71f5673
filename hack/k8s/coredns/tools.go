//go:build tools

// Package corednstools records the command hack/k8s/build.sh builds,
// CoreDNS's own main package, so that `go mod tidy` in this wrapper module
// keeps its dependencies. It is not part of the ztunnel-go module and is
// never compiled.
package corednstools

import _ "github.com/coredns/coredns"
