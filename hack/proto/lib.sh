# Shared by gen.sh and check.sh; source it, do not run it.
#
# Tool versions are pinned here; the Makefile may override them through the
# environment (BUF_VERSION, PROTOC_GEN_GO_VERSION, PROTOC_GEN_GO_GRPC_VERSION)
# and TOOLS_BIN. Tools live in $TOOLS_BIN (default .tools/bin, gitignored) and
# are (re)installed with `go install` when missing or at another version, so
# every machine generates byte-identical code.

set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
GO="${GO:-go}"
TOOLS_BIN="${TOOLS_BIN:-$ROOT/.tools/bin}"
BUF_VERSION="${BUF_VERSION:-v1.75.0}"
PROTOC_GEN_GO_VERSION="${PROTOC_GEN_GO_VERSION:-v1.36.12}"
PROTOC_GEN_GO_GRPC_VERSION="${PROTOC_GEN_GO_GRPC_VERSION:-v1.5.1}"

API_DIR=internal/api
TEMPLATE=hack/proto/buf.gen.yaml

# ensure_tool NAME MODULE_PATH VERSION WANT_OUTPUT: install MODULE_PATH@VERSION into
# TOOLS_BIN unless "$TOOLS_BIN/NAME --version" already prints WANT_OUTPUT.
ensure_tool() {
	local name="$1" pkg="$2" version="$3" want="$4" have=""
	if [[ -x "$TOOLS_BIN/$name" ]]; then
		have="$("$TOOLS_BIN/$name" --version 2>&1 || true)"
	fi
	if [[ "$have" != "$want" ]]; then
		echo "proto: installing $pkg@$version into $TOOLS_BIN (found: ${have:-none})" >&2
		mkdir -p "$TOOLS_BIN"
		GOBIN="$TOOLS_BIN" "$GO" install "$pkg@$version"
		have="$("$TOOLS_BIN/$name" --version 2>&1)"
		if [[ "$have" != "$want" ]]; then
			echo "proto: $name --version says '$have', want '$want'" >&2
			exit 1
		fi
	fi
}

ensure_tools() {
	ensure_tool buf github.com/bufbuild/buf/cmd/buf "$BUF_VERSION" "${BUF_VERSION#v}"
	ensure_tool protoc-gen-go google.golang.org/protobuf/cmd/protoc-gen-go \
		"$PROTOC_GEN_GO_VERSION" "protoc-gen-go $PROTOC_GEN_GO_VERSION"
	ensure_tool protoc-gen-go-grpc google.golang.org/grpc/cmd/protoc-gen-go-grpc \
		"$PROTOC_GEN_GO_GRPC_VERSION" "protoc-gen-go-grpc ${PROTOC_GEN_GO_GRPC_VERSION#v}"
}

# generate OUT: write the generated Go code for every .proto under API_DIR to
# OUT/API_DIR/... (OUT="." regenerates in place).
generate() {
	local out="$1"
	(
		cd "$ROOT"
		PATH="$TOOLS_BIN:$PATH" "$TOOLS_BIN/buf" generate "$API_DIR" --template "$TEMPLATE" -o "$out"
	)
}

# generated_files DIR: the generated files under DIR, sorted, relative to DIR.
generated_files() {
	(cd "$1" && find . -type f -name '*.pb.go' | sed 's|^\./||' | LC_ALL=C sort)
}
