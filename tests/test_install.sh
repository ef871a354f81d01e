#!/usr/bin/env bash
# `cmake --install` to a temporary prefix, the prefix moved elsewhere, then the examples built
# against the moved package by the plainest consumer (tests/install_consumer: find_package(fsdp)
# and target_link_libraries(... fsdp::fsdp), no C++ standard, no paths), and both run a few
# steps. So the package carries C++20 and finds its dependencies itself: it is relocatable.
# Usage: tests/test_install.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
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
# Relocatable: the package names no absolute path (its dependencies are found where it is used).
mv "$tmp/prefix" "$tmp/moved"
if grep -nE '(INTERFACE|IMPORTED)_[A-Z_]+ "([^"]*;)?/' "$tmp/moved/lib/cmake/fsdp/"*.cmake; then
  echo "FAIL: the installed CMake package holds absolute paths (above)"; exit 1
fi
"$tmp/moved/bin/fsdp" --help >/dev/null
mkdir "$tmp/consumer"
cp "$src/tests/install_consumer/CMakeLists.txt" "$src/examples/custom_model.cpp" \
   "$src/examples/train_loop.cpp" "$tmp/consumer/"
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
# The source tree is not on any path here: only the moved package is.
cmake -S "$tmp/consumer" -B "$tmp/consumer-build" "${generator[@]}" \
  -DCMAKE_PREFIX_PATH="$tmp/moved" "${launcher[@]}" >"$tmp/configure.log" 2>&1 ||
  { cat "$tmp/configure.log"; echo "FAIL: the consumer does not configure"; exit 1; }
cmake --build "$tmp/consumer-build" -j 2 >"$tmp/build.log" 2>&1 ||
  { tail -40 "$tmp/build.log"; echo "FAIL: the consumer does not build"; exit 1; }
"$tmp/consumer-build/custom_model" cpu 2
"$tmp/consumer-build/train_loop" cpu 2
echo "PASS: installed, moved the prefix, built both examples with find_package(fsdp) alone, ran them"
