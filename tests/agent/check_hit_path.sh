#!/bin/sh
# Checks from the machine code that the signal guards' hit path (signal_guard_hit.cc: the
# guard probes' handlers, signal delivery, the fault handler) calls no library function:
# its object may refer to the engine's own symbols (namespace probefs) and to the
# safe-copy routines (arch/safe_copy.h), nothing else.
#   $@: the objects of probefs_agent_signals (CMake may pass them as one ';'-separated
#       argument)
set -eu
hit=""
for o in $(echo "$@" | tr ';' ' '); do case "$o" in *signal_guard_hit.cc.o) hit=$o ;; esac; done
[ -n "$hit" ] || { echo "signal_guard_hit.cc.o not found"; exit 1; }
outside=$(nm -u "$hit" | awk '{print $2}' |
          grep -vE '^(_GLOBAL_OFFSET_TABLE_|_ZN7probefs|probefs_arch_safe_(copy|strncpy)$)' ||
          true)
if [ -n "$outside" ]; then
  echo "signal_guard_hit.cc.o refers to outside symbols:"; echo "$outside"; exit 1
fi
echo "signal guards' hit path: no library calls"
