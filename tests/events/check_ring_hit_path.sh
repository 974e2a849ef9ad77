#!/bin/sh
# Checks from the machine code that the ring producer (events/ring.h), as the agent's hit
# path instantiates it, calls no library function, uses no vector register, and enters the
# kernel only to wake the reader (ring_wake) or to register for its barrier:
#   $1: the object of ring_hit_path_probe.cc, built -O2 -mgeneral-regs-only
set -eu
obj=$1
undefined=$(nm -u "$obj" | grep -v '_GLOBAL_OFFSET_TABLE_' || true)
if [ -n "$undefined" ]; then
  echo "ring producer refers to outside symbols:"; echo "$undefined"; exit 1
fi
dis=$(objdump -d --no-show-raw-insn "$obj")
if echo "$dis" | grep -qE '%[xyz]mm[0-9]'; then
  echo "ring producer uses vector registers:"; echo "$dis" | grep -E '%[xyz]mm[0-9]'; exit 1
fi
# The functions that contain a syscall instruction.
with_syscall=$(echo "$dis" | awk '/^[0-9a-f]+ <.*>:$/ { fn = $2 } /\tsyscall/ { print fn }' |
               sort -u | tr '\n' ' ')
for fn in $with_syscall; do
  case "$fn" in
    *ring_wake*|'<probefs_ring_probe_register>:') ;;
    *) echo "system call in $fn"; exit 1 ;;
  esac
done
# Calls only to ring_wake (the cold wake path, emitted once): each call's relocation
# names it.
calls=$(objdump -dr --no-show-raw-insn "$obj" | awk '
  pending { if ($0 !~ /R_X86_64_(PLT32|PC32)[ \t]+[^ ]*ring_wake/) print call; pending = 0 }
  /\tcall/ { call = $0; pending = 1 }
  END { if (pending) print call }')
if [ -n "$calls" ]; then
  echo "ring producer calls out:"; echo "$calls"; exit 1
fi
echo "ring hit path: no library calls, general registers only"
