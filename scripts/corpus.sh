#!/bin/sh
# Prints the corpus files of `make run`, one path a line, sorted: the reStructuredText sources
# of the Python documentation (Debian's python3-doc; docs/data.md says why). Installs nothing:
# the Makefile's package list does. Fails in one line when the package is missing.
set -eu
dir=$(ls -d /usr/share/doc/python3.*/html/_sources 2>/dev/null | sort -V | tail -n 1)
if [ -z "$dir" ]; then
  echo "corpus.sh: no /usr/share/doc/python3.*/html/_sources (install Debian's python3-doc)" >&2
  exit 1
fi
find "$dir" -type f -name '*.txt' | LC_ALL=C sort
