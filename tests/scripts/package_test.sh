#!/usr/bin/env bash
# scripts/package on the build tree under test, then the package as a user gets it:
#   - its dependencies are all satisfied on this machine (dpkg --no-act, nothing changed);
#   - it installs into a scratch dpkg root (dpkg --root: its own database, nothing of the
#     machine's touched) with every file where README and the man pages say;
#   - the installed probefs finds the installed agent (not the build tree's), mounts,
#     and traces the installed demo program: a kprobe-style event and, through the
#     installed probefs-probe, one from the program's DWARF;
#   - it removes cleanly: nothing of it is left in the root but dpkg's own files.
# Usage: package_test.sh SOURCE_DIR BUILD_DIR VERSION
set -euo pipefail
src=$1 build=$2 version=$3
work=$(mktemp -d /tmp/probefs-package-test-XXXXXX)
mnt=$work/mnt
root=$work/root
cleanup() {
  if mountpoint -q "$mnt" 2>/dev/null; then
    timeout 20 fusermount3 -u "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

deb=$(timeout 300 "$src/scripts/package" "$build" "$work/out")
[ -f "$deb" ] || fail "scripts/package printed '$deb', not a package"
[ "$(dpkg-deb -f "$deb" Package)" = probefs ] || fail "the package is not named probefs"
[ "$(dpkg-deb -f "$deb" Version)" = "$version" ] || fail "the package's version is not $version"

# Every dependency the package declares is satisfied here (dpkg-shlibdeps found them).
if ! noact=$(timeout 120 dpkg --no-act -i "$deb" 2>&1); then
  echo "$noact" >&2
  fail "dpkg --no-act -i refuses the package on this machine"
fi

dpkg_root() { timeout 120 dpkg --root="$root" --log="$root/var/log/dpkg.log" "$@"; }
mkdir -p "$root/var/lib/dpkg/info" "$root/var/lib/dpkg/updates" "$root/var/log"
touch "$root/var/lib/dpkg/status" "$root/var/lib/dpkg/available"
# The scratch database has none of the libraries the package needs: they are the machine's.
dpkg_root --force-depends -i "$deb" >"$work/install.log" 2>&1 ||
  { cat "$work/install.log" >&2; fail "dpkg -i into a scratch root"; }
for f in usr/bin/probefs usr/bin/probefs-probe usr/libexec/probefs/libprobefs-agent.so \
         usr/libexec/probefs/probefs_demo_prog usr/share/man/man8/probefs.8.gz \
         usr/share/man/man1/probefs-probe.1.gz usr/share/doc/probefs/README.md; do
  [ -e "$root/$f" ] || fail "the package has no /$f"
done

unset PROBEFS_AGENT PROBEFS_TRACEFS_SHIM TRACEFS_PATH
probefs=$root/usr/bin/probefs
prog=$root/usr/libexec/probefs/probefs_demo_prog
[ "$(timeout 20 "$probefs" --version)" = "probefs $version" ] || fail "probefs --version"
mkdir "$mnt"
timeout 60 "$probefs" "$mnt" || fail "the installed probefs does not mount"
agent=$(timeout 60 "$probefs" exec "$mnt" -- grep -o '/[^ ]*/libprobefs-agent[.]so' /proc/self/maps | head -n 1)
[ "$agent" = "$(realpath "$root/usr/libexec/probefs/libprobefs-agent.so")" ] ||
  fail "a target of the installed probefs maps '$agent', not the installed agent"

echo 'p:pkg/order probefs_demo_prog:price_order id=%di:s32 item=+0(%si):string' >>"$mnt/kprobe_events"
timeout 60 "$root/usr/bin/probefs-probe" -q --target "$mnt" -x "$prog" 'pkg:sourced=price_order id quantity' ||
  fail "the installed probefs-probe"
echo 1 >"$mnt/events/pkg/enable"
out=$(timeout 120 "$probefs" exec "$mnt" -- "$prog" 3 0)
[ "$out" = "3 orders, total 338" ] || fail "the traced program printed '$out'"
# head reads past its six lines and, as on the kernel's trace_pipe, cannot seek back: it
# says so on stderr.
lines=$(timeout 60 head -n 6 "$mnt/trace_pipe" 2>/dev/null)
echo "$lines"
for want in 'order: (price_order+0x0/0x[0-9a-f]*) id=0 item="apple"' \
            'sourced: (0x[0-9a-f]*) id=0 quantity=1' \
            'order: (price_order+0x0/0x[0-9a-f]*) id=2 item="cheese"' \
            'sourced: (0x[0-9a-f]*) id=2 quantity=3'; do
  grep -q -- "$want" <<<"$lines" || fail "no line matching '$want' in trace_pipe"
done
timeout 20 fusermount3 -u "$mnt" || fail "unmount"

dpkg_root -P probefs >"$work/remove.log" 2>&1 || { cat "$work/remove.log" >&2; fail "dpkg -P"; }
left=$(cd "$root" && find . -mindepth 1 -not -type d -not -path './var/*')
[ -z "$left" ] || fail "files left after removal: $left"
left=$(cd "$root" && find . -mindepth 1 -type d -not -path './var' -not -path './var/*')
[ -z "$left" ] || fail "directories left after removal: $left"
echo "package: installed, traced and removed"
