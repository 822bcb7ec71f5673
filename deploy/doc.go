// Package deploy holds ztunnel-go's Kubernetes deployment: the Helm chart
// (chart/ztunnel-go), the manifests rendered from it (manifests/) and
// check.sh, which lints and renders the chart and runs this package's tests:
// a server-side dry-run apply of the rendered manifests against a real API
// server, plus an RBAC check of what each component may do; and the
// binaries' own parsing (ztunnel-cp and ztunnel-cni --check-flags,
// internal/node/config for the node proxy) run on the arguments and environment
// the manifests give them, checked against the manifests' probes, Service,
// volumes and RBAC. It has no Go code of its own; nothing imports it.
package deploy
