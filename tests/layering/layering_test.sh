#!/usr/bin/env bash
# The include-layering check must catch what it is for: run on a tree of files that each
# cross a forbidden arrow (and include some allowed things beside), it fails and names
# every crossing, file:line and arrow, and nothing else.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
check=$here/../../scripts/check_layering
out=$(mktemp)
trap 'rm -f "$out"' EXIT
rc=0
"$check" "$here/violations" >"$out" || rc=$?
if [ "$rc" -ne 1 ]; then
  echo "check_layering exited $rc on the violating tree, not 1" >&2
  cat "$out" >&2
  exit 1
fi
diff -u "$here/violations.expected" "$out"
