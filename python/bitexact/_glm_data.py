"""The data of `bitexact train` in Python (docs/train_cli.md, "Data and its
order"; src/glm/glm_data.c, src/cli/train_data.c): the synthetic Markov corpus, ``.npy`` and
nanoGPT ``.bin`` token files, and the order of the sequences (with and
without ``--shuffle``), for the framework bindings' trainers
(bitexact._glm_run). Integer arithmetic only (numpy uint64 wraps mod
2^64 as C's uint64_t does), so the tokens equal the C trainer's, and so
does ``entropy_rate`` (the same double operations in the same order).

Threading: plain functions and an immutable-after-construction
:class:`Data`; no shared state.
"""
import math
import os

import numpy as np

from . import InvalidArgumentError

SYNTH_TOKENS = (1 << 20) + 1  # TD_SYNTH_TOKENS
_M64 = (1 << 64) - 1


def mix(z):
    """splitmix64's output function of z + 0x9E3779B97F4A7C15 (Python int)."""
    z = (z + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def rand(seed, domain, i):
    """td_rand: mix(mix(mix(seed) ^ domain) ^ i)."""
    return mix(mix(mix(seed) ^ domain) ^ i)


def rand3(seed, domain, a, b):
    return mix(rand(seed, domain, a) ^ b)


def mulhi(x, n):
    return (x * n) >> 64


def _mix_np(z):
    """mix() over a uint64 array (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        z = z + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def synthetic(vocab, seed):
    """(tokens int32 [2^20 + 1], entropy_bits, entropy_nats): the Markov
    corpus of glm_data.c's glm_synth_tokens."""
    V, N = int(vocab), SYNTH_TOKENS
    K = min(8, V - 1)
    offs, c = [], 0
    while len(offs) < K:
        o = 1 + mulhi(rand(seed, 1, c), V - 1)
        if o not in offs:
            offs.append(o)
        c += 1
    tok0 = mulhi(rand(seed, 2, 0), V)
    base = np.uint64(mix(mix(seed) ^ 3))
    r = _mix_np(base ^ np.arange(N, dtype=np.uint64))  # rand(seed, 3, t)
    # k = min(clz64(r), K - 1): clz64(r) >= j exactly when r < 2^(64 - j)
    k = np.zeros(N, dtype=np.int64)
    for j in range(1, K):
        k += r < np.uint64(1 << (64 - j))
    steps = np.asarray(offs, dtype=np.int64)[k]
    toks = np.empty(N, dtype=np.int64)
    toks[0] = tok0
    toks[1:] = (tok0 + np.cumsum(steps[:-1])) % V
    h = 0.0
    for j in range(K - 1):
        h += float(j + 1) * math.ldexp(1.0, -(j + 1))
    h += float(K - 1) * math.ldexp(1.0, -(K - 1))
    return toks.astype(np.int32), h, h * float.fromhex("0x1.62e42fefa39efp-1")


_NPY_TYPES = {"<i2": np.int16, "<u2": np.uint16, "<i4": np.int32, "<u4": np.uint32, "<i8": np.int64}


def read_tokens(path, vocab):
    """(kind, tokens int64) of a ``.npy`` (1-D, '<i2' '<u2' '<i4' '<u4'
    '<i8') or raw uint16 ``.bin`` file; every id checked in [0, vocab)."""
    with open(path, "rb") as f:
        head = f.read(6)
    if head == b"\x93NUMPY":
        a = np.load(path, mmap_mode="r", allow_pickle=False)
        if a.dtype.str not in _NPY_TYPES or a.ndim != 1:
            raise InvalidArgumentError(f"{path}: .npy token ids must be a 1-D array of "
                                       f"{sorted(_NPY_TYPES)}, not {a.dtype.str} {a.shape}")
        kind, toks = "npy", np.asarray(a, dtype=np.int64)
    elif path.endswith(".bin"):
        if os.path.getsize(path) % 2:
            raise InvalidArgumentError(f"{path}: a .bin token file (raw little-endian uint16) "
                                       "has an odd size")
        kind, toks = "bin", np.fromfile(path, dtype="<u2").astype(np.int64)
    else:
        raise InvalidArgumentError(f"{path}: neither a .npy file (no \\x93NUMPY magic) nor a raw "
                                   "uint16 file named *.bin")
    bad = np.flatnonzero((toks < 0) | (toks >= vocab))
    if bad.size:
        i = int(bad[0])
        raise InvalidArgumentError(f"{path}: token id {int(toks[i])} at index {i} is out of "
                                   f"range [0, vocab_size {vocab})")
    return kind, toks


class Data:
    """The token stream of a run: ``Data(vocab, seq_len, seed, path=None,
    shuffle=False)``; ``kind`` ("synthetic", "npy", "bin"), ``ntokens``,
    ``nseq``, ``entropy_nats`` (NaN unless synthetic); :meth:`sequence`
    (global sequence -> data sequence) and :meth:`tokens` (its L + 1 ids)."""

    def __init__(self, vocab, seq_len, seed, path=None, shuffle=False):
        self.seq_len, self.seed, self.shuffle = int(seq_len), int(seed), bool(shuffle)
        self.entropy_bits = self.entropy_nats = float("nan")
        if path is None:
            self.kind = "synthetic"
            self.toks, self.entropy_bits, self.entropy_nats = synthetic(vocab, self.seed)
        else:
            self.kind, self.toks = read_tokens(path, vocab)
        self.ntokens = int(self.toks.shape[0])
        if self.ntokens < self.seq_len + 1:
            raise InvalidArgumentError(f"{self.ntokens} tokens are fewer than one sequence of "
                                       f"seq_len + 1 = {self.seq_len + 1}")
        self.nseq = (self.ntokens - 1) // self.seq_len
        self._perm_epoch, self._perm = -1, None

    def sequence(self, g):
        """The data sequence of global sequence g: g mod S, or with shuffle
        perm_e(g mod S) for epoch e = g div S (a Fisher-Yates shuffle drawn
        from rand3(seed, 4, e, i))."""
        S = self.nseq
        e, k = divmod(int(g), S)
        if not self.shuffle:
            return k
        if self._perm_epoch != e:
            p = list(range(S))
            for i in range(S - 1, 0, -1):
                j = mulhi(rand3(self.seed, 4, e, i), i + 1)
                p[i], p[j] = p[j], p[i]
            self._perm, self._perm_epoch = p, e
        return self._perm[k]

    def tokens(self, i):
        """Tokens [i*L, i*L + L + 1) of data sequence i (int64)."""
        a = i * self.seq_len
        return np.asarray(self.toks[a:a + self.seq_len + 1], dtype=np.int64)
