#!/usr/bin/env bash
# Builds the Kubernetes test binaries from their Go modules at the versions the
# wrapper modules pin, into a cache directory outside the repository.
#
#   hack/k8s/build.sh [-n] [-o CACHE_ROOT] [k8s] [helm] [node] [coredns]
#
#   k8s   etcd, kube-apiserver and kubectl (hack/k8s/go.mod: v3.7.0, v1.37.2)
#   helm  helm v3 (hack/k8s/helm/go.mod: v3.22.0)
#   node  kubelet, kube-controller-manager, kube-scheduler and kube-proxy
#         (hack/k8s/go.mod: v1.37.2), for the real node of `make test-node`
#   coredns  CoreDNS, the real node's cluster DNS (hack/k8s/coredns/go.mod:
#         v1.15.0): the module's own main package with its full plugin set
#
# With no component k8s and helm are built (node and coredns only when asked). Each component goes into
# CACHE_ROOT/<component>-<hash>, where <hash> covers the component's go.mod,
# go.sum, package list and ldflags; a directory that already holds the
# binaries is reused as is. The script prints one directory per requested
# component on stdout (in the order asked) and logs to stderr. With -n it
# builds nothing: it prints the directories and exits 3 if one is not built.
#
# CACHE_ROOT defaults to $ZTG_K8S_CACHE, else ${XDG_CACHE_HOME:-$HOME/.cache}/ztunnel-go/k8s.
# Concurrent runs are serialized with flock, so parallel test binaries build once.
#
# As of 2026-11 on 2 cores: a cold build (empty Go build cache) of k8s takes
# ~15 CPU-minutes, ~10-12 min alone on the machine (24 min measured while other
# builds shared it); helm ~3 CPU-minutes. A relink with a warm Go build cache
# takes ~20 s, and a cached directory is reused instantly. node, cold: kubelet
# ~3 min and the other three ~1.5 min on 2 cores once k8s has warmed the cache.
# coredns, cold (2026-12, 2 cores, load rising to 20 from other builds): 407 s
# wall, ~6.4 CPU-minutes (its cloud SDKs, quic-go, grpc; little is shared
# with the Kubernetes builds' cache); a 79 MB static binary.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=${ZTG_K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ztunnel-go/k8s}

check_only=
while getopts "no:" opt; do
	case $opt in
	n) check_only=1 ;;
	o) root=$OPTARG ;;
	*) echo "usage: $0 [-n] [-o CACHE_ROOT] [k8s] [helm] [node] [coredns]" >&2; exit 2 ;;
	esac
done
shift $((OPTIND - 1))
components=("$@")
[ ${#components[@]} -gt 0 ] || components=(k8s helm)

GO=${GO:-go}
if ! command -v "$GO" >/dev/null 2>&1; then
	if [ -x /usr/local/go/bin/go ]; then GO=/usr/local/go/bin/go; else
		echo "hack/k8s/build.sh: no go toolchain on PATH" >&2; exit 1
	fi
fi

K8S_VERSION=v1.37.2
HELM_VERSION=v3.22.0
COREDNS_VERSION=v1.15.0

mkdir -p "$root"

# lock NAME: one build of a component at a time, so two test binaries asking
# at once build once. -n only looks, so it does not wait for a build.
lock() {
	[ -z "$check_only" ] || return 0
	exec 9>"$root/.lock-$1"
	flock 9
}

# hashof DIR RECIPE: the cache key of a wrapper module built with RECIPE
# (packages and flags).
hashof() {
	{ cat "$1/go.mod" "$1/go.sum"; echo "$2"; } | sha256sum | cut -c1-16
}

missing=0

# have DIR BIN...: all binaries present and executable.
have() {
	local d=$1; shift
	for b in "$@"; do [ -x "$d/$b" ] || return 1; done
}

# k8s_ldflags: the version stamps the Kubernetes release build sets.
k8s_ldflags() {
	local major=${K8S_VERSION#v}; major=${major%%.*}
	local minor=${K8S_VERSION#v*.}; minor=${minor%%.*}
	local ld="-s -w" p
	for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		ld+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=$major -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
	done
	echo "$ld"
}

build_k8s() {
	local ld
	ld=$(k8s_ldflags)
	local pkgs="k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubectl"
	local out=$root/k8s-$(hashof "$here" "cgo=0 trimpath $pkgs go.etcd.io/etcd/server/v3 $ld")
	lock k8s
	if [ -n "$check_only" ] && ! have "$out" etcd kube-apiserver kubectl; then missing=1; fi
	if [ -z "$check_only" ] && ! have "$out" etcd kube-apiserver kubectl; then
		echo "hack/k8s/build.sh: building etcd, kube-apiserver and kubectl $K8S_VERSION into $out (about 12 min on 2 cores the first time)" >&2
		local tmp
		tmp=$(mktemp -d "$root/.tmp-k8s-XXXXXX")
		local start=$SECONDS
		(
			cd "$here"
			export CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false" GOWORK=off
			# shellcheck disable=SC2086 # $pkgs is a list
			"$GO" build -trimpath -ldflags "$ld" -o "$tmp/" $pkgs
			"$GO" build -trimpath -ldflags "$ld" -o "$tmp/etcd" go.etcd.io/etcd/server/v3
		) >&2 || { rm -rf "$tmp"; echo "hack/k8s/build.sh: k8s build failed" >&2; exit 1; }
		rm -rf "$out"
		mv "$tmp" "$out"
		echo "hack/k8s/build.sh: k8s built in $((SECONDS - start)) s" >&2
	fi
	exec 9>&-
	echo "$out"
}

# build_node: the node components, from the same wrapper module, version and
# ldflags as build_k8s (most of their packages are already in the Go build
# cache from it).
build_node() {
	local ld
	ld=$(k8s_ldflags)
	local bins="kubelet kube-controller-manager kube-scheduler kube-proxy"
	local pkgs="" b
	for b in $bins; do pkgs+=" k8s.io/kubernetes/cmd/$b"; done
	local out=$root/node-$(hashof "$here" "cgo=0 trimpath$pkgs $ld")
	lock node
	# shellcheck disable=SC2086 # $bins is a list
	if [ -n "$check_only" ] && ! have "$out" $bins; then missing=1; fi
	# shellcheck disable=SC2086
	if [ -z "$check_only" ] && ! have "$out" $bins; then
		echo "hack/k8s/build.sh: building $bins $K8S_VERSION into $out (about 5 min on 2 cores the first time)" >&2
		local tmp
		tmp=$(mktemp -d "$root/.tmp-node-XXXXXX")
		local start=$SECONDS
		(
			cd "$here"
			export CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false" GOWORK=off
			# shellcheck disable=SC2086 # $pkgs is a list
			"$GO" build -trimpath -ldflags "$ld" -o "$tmp/" $pkgs
		) >&2 || { rm -rf "$tmp"; echo "hack/k8s/build.sh: node build failed" >&2; exit 1; }
		rm -rf "$out"
		mv "$tmp" "$out"
		echo "hack/k8s/build.sh: node built in $((SECONDS - start)) s" >&2
	fi
	exec 9>&-
	echo "$out"
}

build_helm() {
	# helm's own Makefile derives the default Kubernetes version from the
	# client-go it links (v0.37 -> 1.37).
	local ld="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
	for p in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
		ld+=" -X $p.k8sVersionMajor=1 -X $p.k8sVersionMinor=37"
	done
	local out=$root/helm-$(hashof "$here/helm" "cgo=0 trimpath helm.sh/helm/v3/cmd/helm $ld")
	lock helm
	if [ -n "$check_only" ] && ! have "$out" helm; then missing=1; fi
	if [ -z "$check_only" ] && ! have "$out" helm; then
		echo "hack/k8s/build.sh: building helm $HELM_VERSION into $out" >&2
		local tmp
		tmp=$(mktemp -d "$root/.tmp-helm-XXXXXX")
		local start=$SECONDS
		(
			cd "$here/helm"
			export CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false" GOWORK=off
			"$GO" build -trimpath -ldflags "$ld" -o "$tmp/helm" helm.sh/helm/v3/cmd/helm
		) >&2 || { rm -rf "$tmp"; echo "hack/k8s/build.sh: helm build failed" >&2; exit 1; }
		rm -rf "$out"
		mv "$tmp" "$out"
		echo "hack/k8s/build.sh: helm built in $((SECONDS - start)) s" >&2
	fi
	exec 9>&-
	echo "$out"
}

# build_coredns: CoreDNS's own main package (github.com/coredns/coredns, the
# package its release builds) from the wrapper module hack/k8s/coredns, static,
# with the ldflags of CoreDNS's Makefile (stripped, GitCommit stamped; the
# version is a constant of coremain).
build_coredns() {
	local ld="-s -w -X github.com/coredns/coredns/coremain.GitCommit=$COREDNS_VERSION"
	local out=$root/coredns-$(hashof "$here/coredns" "cgo=0 trimpath github.com/coredns/coredns $ld")
	lock coredns
	if [ -n "$check_only" ] && ! have "$out" coredns; then missing=1; fi
	if [ -z "$check_only" ] && ! have "$out" coredns; then
		echo "hack/k8s/build.sh: building coredns $COREDNS_VERSION into $out" >&2
		local tmp
		tmp=$(mktemp -d "$root/.tmp-coredns-XXXXXX")
		local start=$SECONDS
		(
			cd "$here/coredns"
			export CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false" GOWORK=off
			"$GO" build -trimpath -ldflags "$ld" -o "$tmp/coredns" github.com/coredns/coredns
		) >&2 || { rm -rf "$tmp"; echo "hack/k8s/build.sh: coredns build failed" >&2; exit 1; }
		rm -rf "$out"
		mv "$tmp" "$out"
		echo "hack/k8s/build.sh: coredns built in $((SECONDS - start)) s" >&2
	fi
	exec 9>&-
	echo "$out"
}

for c in "${components[@]}"; do
	case $c in
	k8s) build_k8s ;;
	helm) build_helm ;;
	node) build_node ;;
	coredns) build_coredns ;;
	*) echo "hack/k8s/build.sh: unknown component $c (want k8s, helm, node or coredns)" >&2; exit 2 ;;
	esac
done
if [ "$missing" = 1 ]; then exit 3; fi
