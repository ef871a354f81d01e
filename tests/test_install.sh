#!/usr/bin/env bash
# `cmake --install` to a temporary prefix, then the examples built on their own against the
# installed package (find_package(fsdp), fsdp::fsdp), and one run a few steps.
# Usage: tests/test_install.sh BUILD_DIR EXAMPLES_DIR
set -euo pipefail
build=$1 examples=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >"$tmp/install.log"
for f in bin/fsdp include/fsdp/fsdp.h include/fsdp/launch.h include/fsdp/nn/layers.h \
         include/fsdp/optim.h lib/cmake/fsdp/fsdpConfig.cmake lib/cmake/fsdp/fsdpConfigVersion.cmake; do
  [ -e "$tmp/prefix/$f" ] || { echo "FAIL: the install has no $f"; exit 1; }
done
# The installed headers must not reach into the source tree's private headers.
if grep -rn '#include "\(core\|backend\|runtime\|nn\|optim\|launch\)/' "$tmp/prefix/include"; then
  echo "FAIL: an installed header includes a header that is not installed"; exit 1
fi
"$tmp/prefix/bin/fsdp" --help >/dev/null
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
# The source tree is not on any path here: only the installed package is.
cmake -S "$examples" -B "$tmp/examples" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$tmp/prefix" "${launcher[@]}" >"$tmp/configure.log" 2>&1 ||
  { cat "$tmp/configure.log"; exit 1; }
cmake --build "$tmp/examples" -j 2 >"$tmp/build.log" 2>&1 || { cat "$tmp/build.log"; exit 1; }
"$tmp/examples/examples/custom_model" cpu 2
"$tmp/examples/examples/train_loop" cpu 2
echo "PASS: installed to a temporary prefix, built both examples with find_package(fsdp), ran them"
