"""The model module's data entries as the bindings see them
(bitexact._core.glm_synth_tokens / glm_epoch_perm / glm_synth_entropy_bits,
src/glm/glm_data.c) against an independent pure-Python reading of
docs/train_cli.md's definitions (splitmix64 counters, the Markov corpus,
Fisher-Yates), and their argument checks."""
import math

import numpy as np
import pytest

import bitexact
from bitexact import _core

M64 = (1 << 64) - 1


def mix(z):
    z = (z + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def r(seed, d, i):
    return mix(mix(mix(seed) ^ d) ^ i)


def r3(seed, d, a, b):
    return mix(r(seed, d, a) ^ b)


def clz64(x):
    return 64 - x.bit_length()


def ref_synth(seed, V, n):
    K = min(8, V - 1)
    offs, c = [], 0
    while len(offs) < K:
        o = 1 + ((r(seed, 1, c) * (V - 1)) >> 64)
        if o not in offs:
            offs.append(o)
        c += 1
    tok, out = (r(seed, 2, 0) * V) >> 64, []
    for t in range(n):
        out.append(tok)
        tok = (tok + offs[min(clz64(r(seed, 3, t)), K - 1)]) % V
    return out


def ref_perm(seed, e, S):
    p = list(range(S))
    for i in range(S - 1, 0, -1):
        j = (r3(seed, 4, e, i) * (i + 1)) >> 64
        p[i], p[j] = p[j], p[i]
    return p


@pytest.mark.parametrize("seed,V", [(0, 1024), (7, 2), (2**64 - 1, 9), (12345, 151552)])
def test_synth_tokens_match_the_definition(seed, V):
    got = np.frombuffer(_core.glm_synth_tokens(seed, V, 3000), dtype=np.int32)
    assert got.tolist() == ref_synth(seed, V, 3000)
    K = min(8, V - 1)
    h = sum((k + 1) * math.ldexp(1.0, -(k + 1)) for k in range(K - 1)) + (K - 1) * math.ldexp(
        1.0, -(K - 1))
    assert _core.glm_synth_entropy_bits(V) == h


@pytest.mark.parametrize("seed,e,S", [(0, 0, 1), (0, 1, 8), (3, 5, 1000), (2**63, 2, 77)])
def test_epoch_perm_matches_the_definition(seed, e, S):
    got = np.frombuffer(_core.glm_epoch_perm(seed, e, S), dtype=np.int64)
    assert got.tolist() == ref_perm(seed, e, S)


def test_bad_arguments_are_named():
    with pytest.raises(bitexact.InvalidArgumentError, match="glm_synth_tokens"):
        _core.glm_synth_tokens(0, 1, 10)
    with pytest.raises(bitexact.InvalidArgumentError, match="glm_epoch_perm"):
        _core.glm_epoch_perm(0, 0, 0)
    with pytest.raises(bitexact.InvalidArgumentError, match="glm_synth_entropy_bits"):
        _core.glm_synth_entropy_bits(1)
