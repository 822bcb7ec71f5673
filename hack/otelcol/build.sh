#!/usr/bin/env bash
# Builds the test OpenTelemetry Collector (hack/otelcol: the Collector's OTLP
# receiver and our spanfile exporter, collector v0.165.0 / v1.71.0) into a
# cache directory outside the repository and prints the binary's path.
#
#   hack/otelcol/build.sh [-n]
#
# The directory is ${ZTG_OTELCOL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ztunnel-go}/otelcol-<hash>, <hash> covering
# the wrapper's go.mod, go.sum and main.go: a warm run reuses the binary. With -n it builds nothing and exits 3
# when the binary is not there. Concurrent runs are serialized with flock.
#
# As of 2026-12 on 2 cores: ~5.5 min cold (shared with other builds; its service module brings the
# Collector's own telemetry: otel SDK, grpc, prometheus), ~1.5 min with a warm Go build cache; a 53 MB binary.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=${ZTG_OTELCOL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ztunnel-go}
check_only=
[ "${1:-}" = "-n" ] && check_only=1

GO=${GO:-go}
if ! command -v "$GO" >/dev/null 2>&1; then
	if [ -x /usr/local/go/bin/go ]; then GO=/usr/local/go/bin/go; else
		echo "hack/otelcol/build.sh: no go toolchain on PATH" >&2; exit 1
	fi
fi

hash=$(cat "$here/go.mod" "$here/go.sum" "$here/main.go" | sha256sum | cut -c1-16)
dir=$root/otelcol-$hash
bin=$dir/otelcol
if [ -n "$check_only" ]; then
	echo "$bin"
	[ -x "$bin" ] || exit 3
	exit 0
fi
mkdir -p "$root"
exec 9>"$root/.lock-otelcol"
flock 9
if [ ! -x "$bin" ]; then
	echo "hack/otelcol/build.sh: building the test collector into $dir" >&2
	mkdir -p "$dir"
	(cd "$here" && CGO_ENABLED=0 "$GO" build -trimpath -o "$bin.tmp" .)
	mv "$bin.tmp" "$bin"
fi
echo "$bin"
