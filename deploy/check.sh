#!/usr/bin/env bash
# Checks the deployment: helm lint, helm template diffed against the
# committed manifests, the vendored Istio CRDs against istio.io/api, a
# server-side dry-run apply (plus an RBAC check) of the manifests against a
# real kube-apiserver, and the binaries' own flag and environment parsing
# run on what the manifests pass them (go test ./deploy).
#
#   deploy/check.sh       check (what `make deploy-check` runs)
#   deploy/check.sh -u    regenerate deploy/manifests and the vendored CRDs, then check
#
# helm, etcd and kube-apiserver come from hack/k8s/build.sh (built once, ~15
# min cold on 2 cores; cached afterwards).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

update=
[ "${1:-}" = "-u" ] && update=1

RELEASE=ztunnel-go
NAMESPACE=istio-system
CHART=deploy/chart/ztunnel-go
RENDERED=deploy/manifests/ztunnel-go.yaml

dirs=$(hack/k8s/build.sh k8s helm)
k8s_bin=$(sed -n 1p <<<"$dirs")
helm=$(sed -n 2p <<<"$dirs")/helm

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Keep helm away from the user's own helm configuration and caches.
export HELM_CONFIG_HOME=$tmp/helm/config HELM_CACHE_HOME=$tmp/helm/cache HELM_DATA_HOME=$tmp/helm/data

if [ -n "$update" ]; then
	deploy/update-crds.sh
fi
deploy/update-crds.sh "$tmp/crds"
if ! diff -ru "$CHART/crds" "$tmp/crds"; then
	echo "deploy/check.sh: $CHART/crds differ from istio.io/api's; run deploy/check.sh -u" >&2
	exit 1
fi

echo "--- helm lint" >&2
"$helm" lint --strict "$CHART" --namespace "$NAMESPACE"

echo "--- helm template" >&2
render() {
	{
		echo "# Rendered by deploy/check.sh -u (helm template $RELEASE $CHART --namespace $NAMESPACE --include-crds); do not edit."
		"$helm" template "$RELEASE" "$CHART" --namespace "$NAMESPACE" --include-crds
	}
}
render >"$tmp/rendered.yaml"
if [ -n "$update" ]; then
	mkdir -p "$(dirname "$RENDERED")"
	cp "$tmp/rendered.yaml" "$RENDERED"
fi
if ! diff -u "$RENDERED" "$tmp/rendered.yaml"; then
	echo "deploy/check.sh: $RENDERED is stale; run deploy/check.sh -u" >&2
	exit 1
fi

echo "--- server-side dry-run apply; the binaries on the manifests' arguments" >&2
ZTG_K8S_BIN=$k8s_bin ZTG_HELM_BIN=$helm go test -count=1 -run 'TestDryRunApply|TestManifestMatchesBinaries|TestChart' ./deploy/
