#!/usr/bin/env bash
# Copies the Istio CRDs that ztunnel-go reads (ServiceEntry, WorkloadEntry,
# VirtualService, DestinationRule, AuthorizationPolicy, PeerAuthentication,
# RequestAuthentication, Telemetry)
# from the istio.io/api module that the main go.mod pins into the chart's
# crds/ folder, one file per CRD.
# Istio's own charts ship the same generated YAML (crd-all.gen.yaml).
# Run it after bumping istio.io/api; deploy/check.sh fails when they differ.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=${1:-deploy/chart/ztunnel-go/crds}
version=$(go list -m -f '{{.Version}}' istio.io/api)
dir=$(go mod download -json "istio.io/api@$version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
src=$dir/kubernetes/customresourcedefinitions.gen.yaml
[ -f "$src" ] || { echo "update-crds: $src not found" >&2; exit 1; }
mkdir -p "$out"
for crd in serviceentries.networking.istio.io workloadentries.networking.istio.io \
	virtualservices.networking.istio.io destinationrules.networking.istio.io \
	authorizationpolicies.security.istio.io peerauthentications.security.istio.io \
	requestauthentications.security.istio.io telemetries.telemetry.istio.io; do
	{
		echo "# From istio.io/api $version kubernetes/customresourcedefinitions.gen.yaml by deploy/update-crds.sh; do not edit."
		awk -v want="$crd" '
			function flush() { if (doc ~ ("\n  name: " want "\n")) printf "%s", doc; doc = "" }
			/^---$/ { flush(); next }
			{ doc = doc $0 "\n" }
			END { flush() }
		' "$src" | grep -v '^# DO NOT EDIT'
	} >"$out/$crd.yaml"
	grep -q "^  name: $crd\$" "$out/$crd.yaml" || { echo "update-crds: $crd not in $src" >&2; exit 1; }
done
