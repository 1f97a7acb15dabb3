#!/usr/bin/env python3
"""dev/attention_vs_torch.py — bx_attention_forward / bx_attention_backward
(build/libbitexact.so, via ctypes) against transformers' eager attention
(Glm4MoeAttention's eager_attention_forward: repeat_kv, matmul(q, k^T) *
head_dim**-0.5, the additive causal mask of finfo.min, softmax in fp32,
matmul with v), written out here in torch, on CPU, fp32, and its autograd
gradient; both against the same computation in fp64.

    python3 dev/attention_vs_torch.py [path/to/libbitexact.so]

Prints per configuration and output: the largest and the median ulp distance
between bitexact and torch fp32, and the largest error of each relative to
the fp64 result (in units of max |fp64 value|). Bits are not expected to
agree (torch's reductions are vectorised in orders of its own); the script
fails (exit 1) only if bitexact's error exceeds 4 times torch's plus 2^-20.
"""
import ctypes as C
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bx_ctypes import DLTensor, dl_np, eager, load, ulps  # noqa: E402

lib = load()


class AttnOpts(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("num_threads", C.c_int)]


P = C.POINTER(DLTensor)
I64 = C.c_int64
lib.bx_attention_forward.argtypes = [P, P, P, I64, I64, I64, I64, P, P, C.POINTER(AttnOpts)]
lib.bx_attention_forward.restype = C.c_int
lib.bx_attention_backward.argtypes = [P] * 5 + [I64] * 4 + [P] * 3 + [C.POINTER(AttnOpts)]
lib.bx_attention_backward.restype = C.c_int


def run(B, L, Hq, Hkv, D, qscale, seed):
    g = torch.Generator().manual_seed(seed)
    T = B * L
    q = torch.randn(T, Hq * D, generator=g) * qscale
    k = torch.randn(T, Hkv * D, generator=g)
    v = torch.randn(T, Hkv * D, generator=g)
    do = torch.randn(T, Hq * D, generator=g)
    res = {}
    for dt in (torch.float32, torch.float64):
        xs = [t.to(dt).clone().requires_grad_(True) for t in (q, k, v)]
        o = eager(*xs, B, L, Hq, Hkv, D)
        o.backward(do.to(dt))
        res[dt] = [o.detach().numpy()] + [x.grad.numpy() for x in xs]
    keep = []
    qn, kn, vn, don = (t.numpy().copy() for t in (q, k, v, do))
    o = np.zeros_like(qn)
    st = np.zeros((T, Hq, 2), np.float32)
    dq, dk, dv = np.zeros_like(qn), np.zeros_like(kn), np.zeros_like(vn)
    opts = AttnOpts(C.sizeof(AttnOpts), 0)
    t = [dl_np(a, keep) for a in (qn, kn, vn, o, st, don, dq, dk, dv)]
    rc = lib.bx_attention_forward(t[0], t[1], t[2], L, Hq, Hkv, D, t[3], t[4], opts)
    assert rc == 0, lib.bx_last_error()
    rc = lib.bx_attention_backward(t[5], t[0], t[1], t[2], t[4], L, Hq, Hkv, D, t[6], t[7], t[8], opts)
    assert rc == 0, lib.bx_last_error()
    ok = True
    for name, ours, tf, t64 in zip(("o", "dq", "dk", "dv"), (o, dq, dk, dv), res[torch.float32],
                                   res[torch.float64]):
        u = ulps(ours, tf)
        scale = np.abs(t64).max()
        e_ours = np.abs(ours - t64).max() / scale
        e_torch = np.abs(tf - t64).max() / scale
        ok &= e_ours <= 4 * e_torch + 2.0 ** -20
        print(f"  {name:2s}: ulps vs torch max {u.max():6d} median {np.median(u):4.0f} "
              f"same bits {np.mean(u == 0) * 100:5.1f}%; err vs fp64 ours {e_ours:.2e} "
              f"torch {e_torch:.2e}")
    return ok


def main():
    ok = True
    for cfg in [(2, 64, 8, 2, 64, 1.0), (1, 256, 4, 1, 128, 1.0), (2, 128, 8, 4, 128, 4.0),
                (3, 17, 6, 3, 33, 1.0)]:
        print("B %d L %d Hq %d Hkv %d D %d qscale %g" % cfg)
        ok &= run(*cfg, seed=1)
    print("OK" if ok else "FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
