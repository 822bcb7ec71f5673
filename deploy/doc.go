// Package deploy holds ztunnel-go's Kubernetes deployment: the Helm chart
// (chart/ztunnel-go), the manifests rendered from it (manifests/) and
// check.sh, which lints and renders the chart and runs this package's test:
// a server-side dry-run apply of the rendered manifests against a real API
// server, plus an RBAC check of what each component may do. It has no Go
// code of its own; nothing imports it.
package deploy
