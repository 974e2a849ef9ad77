#!/usr/bin/env bash
# scripts/skipped_tests on a ctest JUnit report that holds a pass, skips that
# expected_skips explains (by name, and by pattern over a parameterised name), skips it
# does not (one with GoogleTest's message, one with only ctest's word) and a test that
# could not run (ctest's failure, no skip): it names each skip with its reason, tells the
# unexplained apart and fails on them; with every skip explained, it passes.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
check=$here/../../scripts/skipped_tests
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp "$here/skips/expected_skips" "$work/EXPECTED"
cd "$work"

rc=0
"$check" "$here/skips/report.xml" EXPECTED >out || rc=$?
if [ "$rc" -ne 1 ]; then
  echo "skipped_tests exited $rc on unexplained skips, not 1" >&2
  cat out >&2
  exit 1
fi
diff -u "$here/skips/output.expected" out

printf '%s\n' 'Suite.*  what this test of the check says' 'script_*  likewise' >>EXPECTED
rc=0
"$check" "$here/skips/report.xml" EXPECTED >out || rc=$?
if [ "$rc" -ne 0 ] || [ "$(tail -n 1 out)" != "skips: 4 explained, 0 unexplained" ]; then
  echo "skipped_tests exited $rc with every skip explained, not 0:" >&2
  cat out >&2
  exit 1
fi

# A pattern without its reason is refused, as is a report that is not there.
echo 'Suite.NoReason' >>EXPECTED
if "$check" "$here/skips/report.xml" EXPECTED >out; then
  echo "skipped_tests took a pattern without its reason" >&2
  exit 1
fi
if "$check" missing.xml "$here/skips/expected_skips" >out; then
  echo "skipped_tests passed without a report" >&2
  exit 1
fi
