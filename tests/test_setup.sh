#!/usr/bin/env bash
# scripts/setup.sh where no package can be installed: dpkg reports every package absent,
# apt-get and sudo fail (each logs that it was called). On a machine where everything is
# present it must exit 0 without calling them; with a tool missing from PATH (cmake) it must
# exit non-zero and name it, and --dry-run must name the package it would install.
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

mkdir -p "$tmp/fake"
for cmd in dpkg dpkg-query apt apt-get sudo; do
  printf '#!/bin/sh\necho "%s $*" >>"%s/calls.log"\necho "%s: package not installed / no network" >&2\nexit 100\n' \
    "$cmd" "$tmp" "$cmd" >"$tmp/fake/$cmd"
  chmod +x "$tmp/fake/$cmd"
done

# 1. Everything present, nothing installable: exit 0, no package tool called.
out=$(PATH="$tmp/fake:$PATH" bash "$repo/scripts/setup.sh" 2>&1); rc=$?
echo "$out"
[ $rc -eq 0 ] || fail "setup.sh exited $rc on a machine with everything needed present"
if grep -q "^setup: optional .* is missing" <<<"$out"; then
  # A machine without an optional library (rapidcheck, Gloo): set-up may try to install it,
  # and must go on when it cannot.
  grep -q "everything needed is present" <<<"$out" || fail "setup.sh did not say the needed part is present"
else
  [ ! -s "$tmp/calls.log" ] || fail "setup.sh called a package tool: $(cat "$tmp/calls.log")"
  grep -q "nothing to install" <<<"$out" || fail "setup.sh did not say that nothing needs installing"
fi

# 2. The same PATH without cmake: exit non-zero and name CMake.
mkdir -p "$tmp/nocmake"
IFS=: read -ra dirs <<<"$PATH"
for dir in "${dirs[@]}"; do  # earlier PATH entries win: ln does not replace a link
  [ -d "$dir" ] && ln -s "$dir"/* "$tmp/nocmake/" 2>/dev/null
done
rm -f "$tmp/nocmake/cmake"
[ ! -e "$tmp/nocmake/cmake" ] || fail "could not make a PATH without cmake"
out=$(PATH="$tmp/fake:$tmp/nocmake" bash "$repo/scripts/setup.sh" 2>&1); rc=$?
echo "$out"
[ $rc -ne 0 ] || fail "setup.sh exited 0 with cmake missing"
grep -q "CMake >=" <<<"$out" || fail "setup.sh did not name the missing cmake"
[ "$(grep -c '^  - ' <<<"$out")" -eq 1 ] || fail "setup.sh listed more than cmake as missing"

# 3. --dry-run names the package it would install, installs nothing, exits 0.
: >"$tmp/calls.log"
out=$(PATH="$tmp/fake:$tmp/nocmake" bash "$repo/scripts/setup.sh" --dry-run 2>&1); rc=$?
echo "$out"
[ $rc -eq 0 ] || fail "setup.sh --dry-run exited $rc"
grep -q "would install (needed): cmake$" <<<"$out" || fail "--dry-run did not name the cmake package"
[ ! -s "$tmp/calls.log" ] || fail "--dry-run called a package tool: $(cat "$tmp/calls.log")"
echo "PASS: set-up checks capabilities, installs nothing when all is present, names what is missing"
