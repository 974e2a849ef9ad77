#!/usr/bin/env bash
# The layering check must catch what it is for: run on a tree of files that each cross a
# forbidden arrow or issue a system call in inline asm outside arch/ (and hold some allowed
# things beside), it fails and names every crossing, file:line and arrow, and nothing else.
# A system call in inline asm fails the check on its own, in a tree with nothing else wrong.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
check=$here/../../scripts/check_layering
out=$(mktemp)
expected=$(mktemp)
asm_only=$(mktemp -d)
trap 'rm -rf "$out" "$expected" "$asm_only"' EXIT

expect_failure() {  # root, expected output
  local rc=0
  "$check" "$1" >"$out" || rc=$?
  if [ "$rc" -ne 1 ]; then
    echo "check_layering exited $rc on $1, not 1" >&2
    cat "$out" >&2
    exit 1
  fi
  diff -u "$2" "$out"
}

expect_failure "$here/violations" "$here/violations.expected"

mkdir -p "$asm_only/agent" "$asm_only/arch/x86_64"
cp "$here/violations/agent/asm.cc" "$asm_only/agent/"
cp "$here/violations/arch/x86_64/syscall_inl.h" "$asm_only/arch/x86_64/"
{
  grep ' system call in inline asm ' "$here/violations.expected"
  echo 'check_layering: 2 files, 0 forbidden includes, 3 system calls in inline asm'
} >"$expected"
expect_failure "$asm_only" "$expected"
