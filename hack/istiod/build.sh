#!/usr/bin/env bash
# Builds istiod (pilot-discovery) from the istio.io/istio Go module at the
# pinned version into a cache directory outside the repository, for the
# opt-in differential test of `make interop-istiod` (e2e/interop).
#
#   hack/istiod/build.sh [-n] [-m]
#
# Prints the path of the pilot-discovery binary. With -n it builds nothing
# and exits 3 when the binary is missing. With -m it prints the module's
# directory in the Go module cache instead (where the test reads Istio's CRDs
# and the bookinfo sample), downloading the module if needed.
#
# The version is the one hack/istioctl/go.mod requires, so istioctl-check and
# interop-istiod test against one Istio. `go install module@version` is used
# rather than a wrapper module because istio.io/istio's go.mod has no replace
# directives, so the module's own go.sum pins every dependency; istio never
# enters our go.mod.
# Cache: ${ZTG_ISTIOD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ztunnel-go}/istiod-<version>.
# As of 2026-12 on 2 cores: ~10 min cold on an idle machine, 16 min measured
# under load 20-28; reused instantly afterwards. Concurrent runs are serialized by flock.
set -euo pipefail

# One pin for Istio's code: the version hack/istioctl's module requires.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ISTIO_VERSION=$(awk '$1 == "istio.io/istio" { print $2 }' "$here/../istioctl/go.mod")
[ -n "$ISTIO_VERSION" ] || { echo "hack/istiod/build.sh: no istio.io/istio in hack/istioctl/go.mod" >&2; exit 1; }
root=${ZTG_ISTIOD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ztunnel-go}
dir=$root/istiod-$ISTIO_VERSION
bin=$dir/pilot-discovery
GO=${GO:-go}
command -v "$GO" >/dev/null 2>&1 || GO=/usr/local/go/bin/go

check_only=
while getopts "nm" opt; do
	case $opt in
	n) check_only=1 ;;
	m) tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
	   (cd "$tmp" && "$GO" mod init x >/dev/null 2>&1 && "$GO" mod download -json "istio.io/istio@$ISTIO_VERSION") |
		sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p'
	   exit 0 ;;
	*) echo "usage: $0 [-n] [-m]" >&2; exit 2 ;;
	esac
done

if [ -x "$bin" ]; then echo "$bin"; exit 0; fi
[ -z "$check_only" ] || exit 3
mkdir -p "$dir"
exec 9>"$root/istiod.lock"
flock 9
if [ ! -x "$bin" ]; then
	echo "hack/istiod/build.sh: building pilot-discovery $ISTIO_VERSION into $dir (10-20 min cold)" >&2
	start=$(date +%s)
	(cd "$(mktemp -d)" && GOBIN=$dir GOFLAGS=-mod=mod "$GO" install "istio.io/istio/pilot/cmd/pilot-discovery@$ISTIO_VERSION") >&2
	echo "hack/istiod/build.sh: built in $(( $(date +%s) - start )) s" >&2
fi
echo "$bin"
