#!/usr/bin/env bash
# gen.sh regenerates the Go code of every .proto under internal/api (the
# *.pb.go files next to each .proto) with the pinned buf, protoc-gen-go and
# protoc-gen-go-grpc. Stale generated files of deleted protos are removed.
# Usage: hack/proto/gen.sh   (what `make proto` runs)
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

ensure_tools
cd "$ROOT"
find "$API_DIR" -type f -name '*.pb.go' -delete
generate .
echo "proto: regenerated $(generated_files "$API_DIR" | wc -l) files under $API_DIR"
