#!/bin/sh
# Checks from the machine code that probecore's hit path calls no library function: the
# objects of dispatch.cc and kretprobe_instances.cc (what an int3, a detour or the return
# trampoline runs) may refer to nothing outside the engine, whose own symbols all live in
# namespace probefs (arch's entry code, probecore's state, the RCU read side).
#   $@: the objects (CMake may pass them as one ';'-separated argument)
set -eu
status=0
n=0
for o in $(echo "$@" | tr ';' ' '); do
  n=$((n + 1))
  # Mangled names of namespace probefs start _ZN7probefs; a thread_local's init wrapper
  # (_ZTW, _ZTH) would be a call, and is refused like any other outside symbol.
  outside=$(nm -u "$o" | awk '{print $2}' | grep -vE '^(_GLOBAL_OFFSET_TABLE_|_ZN7probefs)' ||
            true)
  if [ -n "$outside" ]; then
    echo "$(basename "$o") refers to outside symbols:"; echo "$outside"; status=1
  fi
done
[ "$n" -ge 2 ] || { echo "expected the hit path's objects, got $n"; exit 1; }
[ "$status" -eq 0 ] && echo "probecore hit path: no library calls"
exit "$status"
