//go:build tools

// Package helmtools records the helm command hack/k8s/build.sh builds, so
// that `go mod tidy` in this wrapper module keeps its dependencies. It is
// never compiled.
package helmtools

import _ "helm.sh/helm/v3/cmd/helm"
