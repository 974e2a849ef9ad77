#!/bin/sh
# Checks from the machine code that the hit path calls no library function:
#   $1: the object of hit_path_probe.cc (fetch interpreter, record writer, readers)
#   $2...: the objects of probefs_events (filter_match and glob_match in filter.cc.o)
set -eu
probe=$1
shift
# The only outside symbols allowed are the fault-tolerant copy routines (arch/safe_copy.h).
undefined=$(nm -u "$probe" | grep -vE '_GLOBAL_OFFSET_TABLE_|probefs_arch_safe_(copy|strncpy)$' ||
            true)
if [ -n "$undefined" ]; then
  echo "hit path refers to outside symbols:"; echo "$undefined"; exit 1
fi
filter=""
# CMake may pass the object list as one ';'-separated argument.
for o in $(echo "$@" | tr ';' ' '); do case "$o" in *filter.cc.o) filter=$o ;; esac; done
[ -n "$filter" ] || { echo "filter.cc.o not found"; exit 1; }
for fn in filter_match glob_match; do
  line=$(nm -S "$filter" | awk -v f="$fn" '$3 == "T" && $4 ~ f {print $1, $2, $4}')
  [ -n "$line" ] || { echo "$fn not found in $filter"; exit 1; }
  set -- $line
  start=$((0x$1)); end=$((0x$1 + 0x$2)); sym=$3
  # Relocations inside the function's bytes that name anything but this library's own
  # functions, string constants or jump tables.
  calls=$(objdump -r -j .text "$filter" | while read -r off type target; do
            case "$type" in R_X86_64_*) ;; *) continue ;; esac
            o=$((0x$off))
            if [ "$o" -ge "$start" ] && [ "$o" -lt "$end" ]; then echo "$off $type $target"; fi
          done | grep -vE '_ZN7probefs6events|\.LC[0-9]|\.rodata' || true)
  if [ -n "$calls" ]; then
    echo "$fn refers to outside symbols:"; echo "$calls"; exit 1
  fi
done
echo "hit path: no library calls"
