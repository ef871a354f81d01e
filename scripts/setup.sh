#!/usr/bin/env bash
# Set-up by capability: checks that what the build needs is usable, whatever put it there
# (apt, pip, conda, a module system, Kitware's or NVIDIA's installers), and installs with
# apt-get only what is missing, where apt-get can run (root, or sudo without a password).
# Where nothing can be installed, prints one list of what is missing and how to supply it,
# and exits 1.
#
#   scripts/setup.sh [--dry-run] [--cuda] [--run]
#     --dry-run  check, and print what would be installed; install nothing
#     --cuda     the CUDA backend is wanted: nvcc and NCCL are needed too
#     --run      what `make run` needs on top (data for the training run)
#
# A tool counts when it is on PATH at a usable version; a library counts when CMake finds it
# (cmake/probe/CMakeLists.txt makes the same searches as the build), or, before CMake and a
# compiler are there, when its header is in a standard include directory.
set -uo pipefail
cd "$(dirname "$0")/.."

# ---- What the project needs: one entry per line, fields separated by '|':
#   name | check | Debian package | need | how to supply it without apt
# check: "tool CMD [MIN_VERSION]" a program on PATH (CMD may list alternatives: ninja,make);
#        "cxx20" a C++ compiler that compiles C++20 ($CXX, c++, g++ or clang++);
#        "nvcc MIN_VERSION" the CUDA compiler ($CUDACXX, PATH or /usr/local/cuda/bin);
#        "lib PROBE_NAME HEADER" a library, as cmake/probe finds it;
#        "file PATH" a file that must exist.
# need: required (build and tests) | optional (some tests or tools skip without it) |
#       cuda (with --cuda) | run (with --run, for `make run`)
CMAKE_MIN=$(sed -n 's/^cmake_minimum_required(VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
DEPENDENCIES="
CMake >= ${CMAKE_MIN}|tool cmake ${CMAKE_MIN}|cmake|required|pip install cmake (or Kitware's installer), then put it on PATH
ninja or make|tool ninja,make|ninja-build|required|pip install ninja, or any make
C++20 compiler|cxx20|g++|required|GCC >= 11 or Clang >= 14 as c++ on PATH, or set CXX
CLI11|lib CLI11 CLI/CLI.hpp|libcli11-dev|required|its headers under a prefix in CMAKE_PREFIX_PATH (conda: cli11)
nlohmann-json|lib nlohmann_json nlohmann/json.hpp|nlohmann-json3-dev|required|a prefix with nlohmann_jsonConfig.cmake in CMAKE_PREFIX_PATH (conda: nlohmann_json)
OpenBLAS|lib OpenBLAS cblas.h|libopenblas-dev|required|a prefix with cblas.h and libopenblas in CMAKE_PREFIX_PATH (conda: openblas)
GoogleTest|lib GTest gtest/gtest.h|libgtest-dev|required|a prefix with GTestConfig.cmake in CMAKE_PREFIX_PATH (conda: gtest)
zlib|lib ZLIB zlib.h|zlib1g-dev|required|a prefix with zlib.h and libz in CMAKE_PREFIX_PATH (conda: zlib)
OpenSSL (libcrypto)|lib OpenSSL openssl/hmac.h|libssl-dev|optional|without it the rendezvous store loads the machine's libcrypto at run time
rapidcheck|lib rapidcheck rapidcheck/gtest.h|librapidcheck-dev|optional|without it the property tests (tests/test_shard_properties.cpp) are skipped
SentencePiece|lib SentencePiece sentencepiece_processor.h|libsentencepiece-dev|optional|without it the data tools are not built
PCRE2|lib PCRE2 pcre2.h|libpcre2-dev|optional|without it (or utf8proc) prepare-data reads no tokenizer.json and its tests are left out
utf8proc|lib utf8proc utf8proc.h|libutf8proc-dev|optional|without it (or PCRE2) prepare-data reads no tokenizer.json and its tests are left out
Gloo|lib Gloo gloo/config.h|libgloo-dev|optional|without it CPU ranks as processes (--backend cpu --nproc) are left out and their tests skip
nvcc >= 12.0|nvcc 12.0|nvidia-cuda-toolkit|cuda|the CUDA toolkit from NVIDIA; put nvcc on PATH or set CUDACXX
NCCL|lib NCCL nccl.h|libnccl-dev|cuda|NCCL from NVIDIA (libnccl-dev) under /usr/local/cuda or a prefix in CMAKE_PREFIX_PATH
"

dry_run=0 want_cuda=0 want_run=0
for arg in "$@"; do
  case $arg in
    --dry-run) dry_run=1 ;;
    --cuda) want_cuda=1 ;;
    --run) want_run=1 ;;
    -h|--help) awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "setup: unknown option '$arg' (see --help)" >&2; exit 2 ;;
  esac
done

version_at_least() {  # version_at_least HAVE WANT: true when HAVE >= WANT (dotted numbers)
  [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" = "$2" ]
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

find_cxx20() {  # prints the first compiler that compiles C++20
  cat >"$tmp/cxx20.cpp" <<'CPP'
#include <concepts>
#include <span>
struct A { int x; friend bool operator==(const A&, const A&) = default; };
template <std::integral T> T id(T v) { return v; }
int main() { A a{.x = 1}; std::span<int> s; return id(0) + (a == a ? 0 : 1) + int(s.size()); }
CPP
  local c
  for c in ${CXX:-} c++ g++ clang++; do
    command -v "$c" >/dev/null 2>&1 || continue
    if "$c" -std=c++20 -fsyntax-only "$tmp/cxx20.cpp" >/dev/null 2>&1; then echo "$c"; return 0; fi
  done
  return 1
}

find_nvcc() {
  local c
  for c in ${CUDACXX:-} nvcc /usr/local/cuda/bin/nvcc; do
    command -v "$c" >/dev/null 2>&1 && { echo "$c"; return 0; }
  done
  return 1
}

# The library probe: a tiny configure that records what CMake finds. Empty when it cannot
# run (no usable cmake or compiler yet); lib checks then look for headers instead.
probe_libraries() {
  : >"$tmp/found.txt"
  command -v cmake >/dev/null 2>&1 || return 0
  version_at_least "$(cmake --version | sed -n '1s/[^0-9]*\([0-9.]*\).*/\1/p')" "$CMAKE_MIN" || return 0
  local cxx
  cxx=$(find_cxx20) || return 0
  rm -rf "$tmp/probe"
  CXX=$cxx cmake -S cmake/probe -B "$tmp/probe" >"$tmp/probe.log" 2>&1 &&
    cp "$tmp/probe/found.txt" "$tmp/found.txt"
  return 0
}

header_present() {
  local dir cpath=${CPATH:-} prefixes=${CMAKE_PREFIX_PATH:-}
  for dir in /usr/include /usr/local/include /usr/include/*-linux-gnu /usr/include/openblas \
             /usr/local/cuda/include ${cpath//:/ } ${prefixes//:/\/include }/include; do
    [ -e "$dir/$1" ] && return 0
  done
  return 1
}

# check CHECK...: true when the capability is there; sets $found_as to what was found.
check() {
  local kind=$1; shift
  found_as=""
  case $kind in
    tool)
      local cmd have
      for cmd in ${1//,/ }; do
        command -v "$cmd" >/dev/null 2>&1 || continue
        if [ -n "${2:-}" ]; then
          have=$("$cmd" --version 2>/dev/null | sed -n '1s/[^0-9]*\([0-9][0-9.]*\).*/\1/p')
          version_at_least "${have:-0}" "$2" || { found_as="$cmd $have (too old)"; continue; }
          found_as="$cmd $have"
        else
          found_as=$cmd
        fi
        return 0
      done
      return 1 ;;
    cxx20) found_as=$(find_cxx20) ;;
    nvcc)
      local nvcc have
      nvcc=$(find_nvcc) || return 1
      have=$("$nvcc" --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p')
      version_at_least "${have:-0}" "$1" || { found_as="nvcc $have (too old)"; return 1; }
      found_as="nvcc $have" ;;
    lib)
      if [ -s "$tmp/found.txt" ]; then
        grep -qx "$1 1" "$tmp/found.txt"
      else
        header_present "$2"
      fi ;;
    file) [ -e "$1" ] ;;
    *) echo "setup: bad check '$kind' in DEPENDENCIES" >&2; return 2 ;;
  esac
}

wanted() {  # wanted NEED: does this run need entries of that kind?
  case $1 in
    required|optional) return 0 ;;
    cuda) [ $want_cuda = 1 ] ;;
    run) [ $want_run = 1 ] ;;
    *) return 1 ;;
  esac
}

# Fills missing_required / missing_optional (lines of the table) and present (names).
check_all() {
  probe_libraries
  missing_required="" missing_optional="" present=""
  local name chk pkg need hint
  while IFS='|' read -r name chk pkg need hint; do
    [ -n "$name" ] || continue
    wanted "$need" || continue
    # shellcheck disable=SC2086
    if check $chk; then
      present="$present, ${found_as:-$name}"
    elif [ "$need" = optional ]; then
      missing_optional+="$name|$chk|$pkg|$need|$hint"$'\n'
    else
      missing_required+="$name|$chk|$pkg|$need|$hint"$'\n'
    fi
  done <<<"$DEPENDENCIES"
}

packages_of() { printf '%s' "$1" | cut -d'|' -f3 | tr '\n' ' ' | sed 's/ *$//'; }

# apt-get as root, or through sudo without a password; fails when neither works.
apt_cmd=()
can_use_apt() {
  command -v apt-get >/dev/null 2>&1 || { why_no_apt="apt-get is not on PATH"; return 1; }
  if [ "$(id -u)" = 0 ]; then apt_cmd=(apt-get); return 0; fi
  if command -v sudo >/dev/null 2>&1 && sudo -n true >/dev/null 2>&1; then
    apt_cmd=(sudo -n apt-get); return 0
  fi
  why_no_apt="not root, and sudo needs a password or is missing"
  return 1
}

apt_updated=0
apt_install() {  # apt_install PACKAGE...: true when apt-get installed them all
  [ $apt_updated = 1 ] || {
    "${apt_cmd[@]}" update -qq >"$tmp/apt.log" 2>&1 || { why_no_apt="apt-get update failed (no network?)"; return 1; }
    apt_updated=1
  }
  echo "setup: installing with apt-get: $*"
  DEBIAN_FRONTEND=noninteractive "${apt_cmd[@]}" install -y -qq "$@" >>"$tmp/apt.log" 2>&1 ||
    { why_no_apt="apt-get install failed: $(tail -n1 "$tmp/apt.log")"; return 1; }
}

check_all
if [ -z "$missing_required$missing_optional" ]; then
  echo "setup: everything needed is present (${present#, }); nothing to install"
  exit 0
fi

if [ $dry_run = 1 ]; then
  [ -n "$missing_required" ] && echo "setup: would install (needed): $(packages_of "$missing_required")"
  [ -n "$missing_optional" ] && echo "setup: would install (optional): $(packages_of "$missing_optional")"
  exit 0
fi

why_no_apt=""
if can_use_apt; then
  if [ -n "$missing_required" ]; then
    # shellcheck disable=SC2046
    apt_install $(packages_of "$missing_required")
  fi
  if [ -n "$missing_optional" ]; then
    # Each on its own: one that this distribution lacks must not block the others.
    for pkg in $(packages_of "$missing_optional"); do apt_install "$pkg" || true; done
  fi
  check_all
fi

if [ -n "$missing_optional" ]; then
  while IFS='|' read -r name _ pkg _ hint; do
    [ -n "$name" ] && echo "setup: optional $name is missing (Debian: $pkg): $hint"
  done <<<"$missing_optional"
fi
if [ -n "$missing_required" ]; then
  echo "setup: cannot install what is missing${why_no_apt:+ ($why_no_apt)}; supply these, then run make again:"
  while IFS='|' read -r name _ pkg _ hint; do
    [ -n "$name" ] && echo "  - $name: Debian package $pkg; or $hint"
  done <<<"$missing_required"
  exit 1
fi
echo "setup: everything needed is present (${present#, })"
exit 0
