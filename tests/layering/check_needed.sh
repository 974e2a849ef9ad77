#!/usr/bin/env bash
# The link half of the layering: fails when the ELF object FILE needs (DT_NEEDED) a shared
# library whose name matches REGEX, naming it. With --expect-match, the other way round:
# fails unless one does (the check's own test, on an object that must need it).
#   check_needed.sh [--expect-match] FILE REGEX
set -euo pipefail
expect_match=0
if [ "${1:-}" = --expect-match ]; then
  expect_match=1
  shift
fi
file=$1 regex=$2
needed=$(readelf -d "$file" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
hits=$(grep -E "$regex" <<<"$needed" || true)
if [ "$expect_match" -eq 1 ]; then
  [ -n "$hits" ] && exit 0
  echo "$file needs nothing matching $regex; the check cannot see what it should" >&2
  exit 1
fi
if [ -n "$hits" ]; then
  echo "$file may not need:" $hits >&2
  exit 1
fi
