#!/usr/bin/env bash
# check.sh regenerates the Go code of internal/api into a temporary directory
# and compares it with the committed files. Exits 1 (and says what differs)
# when a .proto was edited without running hack/proto/gen.sh, or a generated
# file was edited by hand.
# Usage: hack/proto/check.sh   (part of `make test`)
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

ensure_tools
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
generate "$tmp"

want="$tmp/$API_DIR"
have="$ROOT/$API_DIR"
stale=0
if ! diff -u <(generated_files "$want") <(generated_files "$have") >"$tmp/files.diff"; then
	echo "proto: the set of generated files differs (- expected, + committed):" >&2
	cat "$tmp/files.diff" >&2
	stale=1
fi
while read -r f; do
	if [[ -f "$have/$f" ]] && ! diff -u "$want/$f" "$have/$f" >"$tmp/file.diff"; then
		echo "proto: $API_DIR/$f is stale:" >&2
		head -n 40 "$tmp/file.diff" >&2
		stale=1
	fi
done < <(generated_files "$want")
if [[ $stale -ne 0 ]]; then
	echo "proto: generated code is out of date; run 'make proto' (hack/proto/gen.sh) and commit the result" >&2
	exit 1
fi
echo "proto: generated code is up to date"
