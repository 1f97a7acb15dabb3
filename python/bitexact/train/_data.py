"""The data of `bitexact train` in Python (docs/train_cli.md, "Data and its
order"), for the framework bindings' trainers (bitexact.train._run): the
``.npy`` and nanoGPT ``.bin`` token files read here; the synthetic Markov
corpus and the ``--shuffle`` permutation are the model module's
(src/glm/glm_data.c, through bitexact._core), so the tokens and the order
are the C trainer's by construction, not by a second implementation.

Threading: plain functions and an immutable-after-construction
:class:`Data`; no shared state.
"""
import os

import numpy as np

from .. import InvalidArgumentError, _core

SYNTH_TOKENS = (1 << 20) + 1  # GLM_SYNTH_TOKENS (src/glm/glm_data.h)


def synthetic(vocab, seed):
    """(tokens int32 [2^20 + 1], entropy_bits, entropy_nats): the Markov
    corpus of the model module (glm_data.c's glm_synth_tokens), computed
    there, not again here."""
    V = int(vocab)
    toks = np.frombuffer(_core.glm_synth_tokens(int(seed), V, SYNTH_TOKENS), dtype=np.int32)
    h = _core.glm_synth_entropy_bits(V)
    return toks, h, h * float.fromhex("0x1.62e42fefa39efp-1")


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
        perm_e(g mod S) for epoch e = g div S (glm_data.h's Fisher-Yates
        shuffle)."""
        S = self.nseq
        e, k = divmod(int(g), S)
        if not self.shuffle:
            return k
        if self._perm_epoch != e:  # the model module's permutation (glm_epoch_perm)
            self._perm = np.frombuffer(_core.glm_epoch_perm(self.seed, e, S), dtype=np.int64)
            self._perm_epoch = e
        return int(self._perm[k])

    def tokens(self, i):
        """Tokens [i*L, i*L + L + 1) of data sequence i (int64)."""
        a = i * self.seq_len
        return np.asarray(self.toks[a:a + self.seq_len + 1], dtype=np.int64)
