#!/bin/sh
# Checks from the machine code that the agent's hit path calls no library function: the
# object of agent/hit.cc may refer only to the engine and the events code linked into the
# agent (namespace probefs), the fault-tolerant copy routines (arch/safe_copy.h) and the
# r_brk stub its hook jumps to. A thread_local's init wrapper (_ZTW, _ZTH) would be a call
# and is refused like any other outside symbol.
#   $@: the object (CMake may pass it as one ';'-separated argument)
set -eu
n=0
for o in $(echo "$@" | tr ';' ' '); do
  n=$((n + 1))
  outside=$(nm -u "$o" | awk '{print $2}' |
            grep -vE '^(_GLOBAL_OFFSET_TABLE_|_ZN7probefs|probefs_arch_safe_(copy|strncpy)$|probefs_agent_dl_stub$)' ||
            true)
  if [ -n "$outside" ]; then
    echo "$(basename "$o") refers to outside symbols:"; echo "$outside"; exit 1
  fi
done
[ "$n" -ge 1 ] || { echo "expected the agent's hit path object"; exit 1; }
echo "agent hit path: no library calls"
