#!/usr/bin/env python3
"""llm.c token files (both layouts) and the batch sampler of docs/data.md, in plain Python
(no numpy, no torch).

The same algorithm as src/data/sampler.cpp (Note [Batch sampler]), bit for bit, so that
bench/torch_llama.py reads the same batches as `fsdp train`. tests/test_data_sampler.cpp runs
this file and compares its windows with the C++ sampler's.

  python3 bench/llm_data.py check FILE --vocab V       (prints the token count and the layout)
  python3 bench/llm_data.py windows FILE --vocab V --seq-len T --batch B --world-size W --seed S --steps N
"""
import argparse
import array
import json
import os
import struct
import sys

# llm.c's two layouts (its dev/data/data_common.py): magic -> (version, array typecode, bytes).
MAGIC = 20240520        # uint16 tokens
VERSION = 1
MAGIC_U32 = 20240801    # uint32 tokens
VERSION_U32 = 7
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
MAX_UINT16_VOCAB = 65536
MAX_VOCAB = 1 << 31     # batches hold int32 ids


def _uint32_typecode():
    for code in ("I", "L"):
        if array.array(code).itemsize == 4:
            return code
    raise RuntimeError("this Python has no 4-byte unsigned array type")


LAYOUTS = {MAGIC: (VERSION, "H", "uint16"), MAGIC_U32: (VERSION_U32, _uint32_typecode(), "uint32")}

MASK64 = (1 << 64) - 1
SPLITMIX_GAMMA = 0x9E3779B97F4A7C15
EPOCH_MULTIPLIER = 0xD1B54A32D192ED03


class DataError(Exception):
    """A bad data file or batch shape; the message is one line naming the file."""


def read_token_file(path, vocab, min_tokens=0, purpose="this use"):
    """The tokens of an llm.c token file of either layout, as array('H') or a 4-byte unsigned
    array, validated like TokenFile's constructor (the same one-line messages)."""
    if not 1 <= vocab <= MAX_VOCAB:
        raise DataError(f"vocab {vocab} is out of range for token files (1..{MAX_VOCAB})")
    if not os.path.exists(path):
        raise DataError(f"{path}: cannot open: No such file or directory")
    if not os.path.isfile(path):
        raise DataError(f"{path}: not a regular file, so not a token file")
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < HEADER_BYTES:
                raise DataError(f"{path}: truncated: {size} bytes, shorter than the {HEADER_BYTES}-byte "
                                "header of a token file")
            magic, version, count = struct.unpack("<3i", f.read(12))
            if magic not in LAYOUTS:
                raise DataError(f"{path}: not a token file: magic {magic}, expected {MAGIC} (llm.c's uint16 "
                                f"layout) or {MAGIC_U32} (its uint32 layout)")
            want_version, typecode, name = LAYOUTS[magic]
            if version != want_version:
                raise DataError(f"{path}: token file version {version} is not supported (magic {magic}, the "
                                f"{name} layout, goes with version {want_version})")
            width = array.array(typecode).itemsize
            expected = HEADER_BYTES + width * count
            if count < 0 or expected != size:
                what = "truncated" if expected > size else "corrupt"
                raise DataError(f"{path}: {what}: the header says {count} {name} tokens ({expected} bytes) but "
                                f"the file has {size} bytes")
            if count < min_tokens:
                raise DataError(f"{path}: {count} tokens, fewer than the {min_tokens} that {purpose} needs")
            f.seek(HEADER_BYTES)
            data = f.read()
    except OSError as e:
        raise DataError(f"{path}: cannot open: {e.strerror}") from None
    tokens = array.array(typecode)
    tokens.frombytes(data)
    if sys.byteorder != "little":
        tokens.byteswap()
    if count and max(tokens) >= vocab:
        pos = next(i for i, t in enumerate(tokens) if t >= vocab)
        raise DataError(f"{path}: token {tokens[pos]} at position {pos} is >= the vocabulary size {vocab}")
    return tokens


def token_dtype(tokens):
    """'uint16' or 'uint32': the layout of what read_token_file returned."""
    return "uint16" if tokens.itemsize == 2 else "uint32"


def write_token_file(path, tokens, dtype="uint16"):
    """Writes a sequence of ints in llm.c's uint16 (ids < 65536) or uint32 layout."""
    magic = MAGIC if dtype == "uint16" else MAGIC_U32
    version, typecode, _ = LAYOUTS[magic]
    header = array.array("i", [0] * HEADER_INTS)
    header[0], header[1], header[2] = magic, version, len(tokens)
    body = array.array(typecode, tokens)
    if sys.byteorder != "little":
        header.byteswap()
        body.byteswap()
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(body.tobytes())


def splitmix64_next(state):
    """One step of splitmix64: returns (new_state, output)."""
    state = (state + SPLITMIX_GAMMA) & MASK64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return state, z ^ (z >> 31)


def epoch_permutation(seed, epoch, n):
    """Epoch `epoch`'s order of n windows: Fisher-Yates from the top, j = splitmix64 % (i + 1)."""
    perm = list(range(n))
    state = (seed ^ ((epoch * EPOCH_MULTIPLIER) & MASK64)) & MASK64
    for i in range(n - 1, 0, -1):
        state, r = splitmix64_next(state)
        j = r % (i + 1)
        perm[i], perm[j] = perm[j], perm[i]
    return perm


def window_count(num_tokens, seq_len):
    """Windows of seq_len + 1 tokens at stride seq_len."""
    return (num_tokens - 1) // seq_len if num_tokens >= 1 else 0


def _too_short(path, num_tokens, batch, seq_len, world_size):
    return DataError(f"{path}: {num_tokens} tokens, fewer than the {world_size * batch * seq_len + 1} that "
                     f"one global batch ({world_size} ranks x {batch} sequences x {seq_len} tokens, + 1) needs")


class BatchSampler:
    """Training batches: global batch `step` is G = world_size * batch windows of epoch
    step // steps_per_epoch's permutation; rank r owns windows [r * batch, (r + 1) * batch)."""

    def __init__(self, num_tokens, batch, seq_len, world_size, seed, path="token file"):
        if batch < 1 or seq_len < 1 or world_size < 1:
            raise DataError(f"batch shape needs batch, seq_len and world_size >= 1 "
                            f"(got {batch}, {seq_len}, {world_size})")
        self.batch, self.seq_len, self.world_size, self.seed = batch, seq_len, world_size, seed
        self.windows = window_count(num_tokens, seq_len)
        self.steps_per_epoch = self.windows // (batch * world_size)
        if self.steps_per_epoch < 1:
            raise _too_short(path, num_tokens, batch, seq_len, world_size)
        self._epoch, self._perm = -1, None

    def global_windows(self, step):
        epoch = step // self.steps_per_epoch
        if epoch != self._epoch:
            self._epoch, self._perm = epoch, epoch_permutation(self.seed, epoch, self.windows)
        g = self.batch * self.world_size
        first = (step % self.steps_per_epoch) * g
        return self._perm[first:first + g]

    def rank_windows(self, step, rank):
        return self.global_windows(step)[rank * self.batch:(rank + 1) * self.batch]


class ValidationBatches:
    """Fixed validation batches: batch k is windows [k * G, (k + 1) * G) in order."""

    def __init__(self, num_tokens, batch, seq_len, world_size, max_batches, path="token file"):
        self.batch, self.seq_len, self.world_size = batch, seq_len, world_size
        available = window_count(num_tokens, seq_len) // (batch * world_size)
        if available < 1:
            raise _too_short(path, num_tokens, batch, seq_len, world_size)
        self.count = min(max_batches, available)

    def rank_windows(self, k, rank):
        first = k * self.batch * self.world_size + rank * self.batch
        return list(range(first, first + self.batch))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="validate a token file and print its token count")
    windows = sub.add_parser("windows", help="print the global batches' windows as JSON")
    for s in (check, windows):
        s.add_argument("file")
        s.add_argument("--vocab", type=int, default=MAX_VOCAB)
    windows.add_argument("--seq-len", type=int, required=True)
    windows.add_argument("--batch", type=int, required=True, help="sequences per rank")
    windows.add_argument("--world-size", type=int, default=1)
    windows.add_argument("--seed", type=int, required=True)
    windows.add_argument("--steps", type=int, required=True)
    a = p.parse_args()
    try:
        tokens = read_token_file(a.file, a.vocab)
        if a.command == "check":
            print(len(tokens), token_dtype(tokens))
            return 0
        s = BatchSampler(len(tokens), a.batch, a.seq_len, a.world_size, a.seed, a.file)
        print(json.dumps({"token_dtype": token_dtype(tokens), "windows": s.windows,
                          "steps_per_epoch": s.steps_per_epoch,
                          "global_windows": [s.global_windows(step) for step in range(a.steps)]}))
    except DataError as e:
        print(f"llm_data: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
