"""dev/bx_ctypes.py — what the ctypes comparison scripts (dev/*_vs_torch.py)
and the torch benchmarks (bench/*_torch.py) share: the DLPack structs (from
tests/python/dlpack_ctypes.py, re-exported), loading libbitexact.so,
DLTensor views of numpy arrays and torch tensors, the ulp distance of fp32
arrays, the timing loop, and transformers' eager attention written out in
torch. Import it after putting dev/ on sys.path.
"""
import ctypes as C
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
from dlpack_ctypes import DLDataType, DLDevice, DLTensor  # noqa: E402,F401

P = C.POINTER(DLTensor)
_NP_CODES = {np.float32: (2, 32), np.int64: (0, 64), np.int32: (0, 32)}


def load(path=None):
    """libbitexact.so at path (default: argv[1], else build/libbitexact.so),
    with bx_last_error's restype set."""
    if path is None:
        path = sys.argv[1] if len(sys.argv) > 1 else "build/libbitexact.so"
    lib = C.CDLL(path)
    lib.bx_last_error.restype = C.c_char_p
    return lib


def dl_np(a, keep):
    """A host DLTensor over a C-contiguous float32, int32 or int64 numpy
    array (keep holds the shape alive; the caller keeps a)."""
    code, bits = _NP_CODES[a.dtype.type]
    shape = (C.c_int64 * a.ndim)(*a.shape)
    keep.append(shape)
    return DLTensor(a.ctypes.data, DLDevice(1, 0), a.ndim, DLDataType(code, bits, 1), shape, None, 0)


def dl_torch(t, keep):
    """A host DLTensor over a contiguous CPU fp32 or bf16 torch tensor
    (keep holds the shape alive; the caller keeps t)."""
    shape = (C.c_int64 * t.dim())(*t.shape)
    keep.append(shape)
    code, bits = (4, 16) if str(t.dtype) == "torch.bfloat16" else (2, 32)
    return DLTensor(C.c_void_p(t.data_ptr()), DLDevice(1, 0), t.dim(), DLDataType(code, bits, 1),
                    C.cast(shape, C.POINTER(C.c_int64)), None, 0)


def ulps(a, b):
    """Elementwise distance in fp32 ulps (sign-magnitude order) of two float32 arrays."""
    ia = a.view(np.int32).astype(np.int64)
    ib = b.view(np.int32).astype(np.int64)
    ia = np.where(ia < 0, -(ia & 0x7FFFFFFF), ia)
    ib = np.where(ib < 0, -(ib & 0x7FFFFFFF), ib)
    return np.abs(ia - ib)


def time_call(fn, reps, min_s):
    """Median seconds per call of fn over reps runs, each at least min_s
    seconds of back-to-back calls, after one warm-up call."""
    fn()
    runs = []
    for _ in range(reps):
        calls, t0 = 0, time.perf_counter()
        while True:
            fn()
            calls += 1
            t1 = time.perf_counter()
            if t1 - t0 >= min_s:
                break
        runs.append((t1 - t0) / calls)
    return statistics.median(runs)


def eager(q, k, v, B, L, Hq, Hkv, D):
    """transformers' eager attention (Glm4MoeAttention's eager_attention_forward:
    repeat_kv, matmul(q, k^T) * head_dim**-0.5, additive causal mask of
    finfo.min, fp32 softmax, matmul with v) on token-major [T, H*D] torch
    inputs; returns [T, Hq*D]."""
    import torch

    R = Hq // Hkv
    qh = q.view(B, L, Hq, D).transpose(1, 2)
    kh = k.view(B, L, Hkv, D).transpose(1, 2)
    vh = v.view(B, L, Hkv, D).transpose(1, 2)
    kh = kh[:, :, None].expand(B, Hkv, R, L, D).reshape(B, Hq, L, D)
    vh = vh[:, :, None].expand(B, Hkv, R, L, D).reshape(B, Hq, L, D)
    w = torch.matmul(qh, kh.transpose(2, 3)) * D ** -0.5
    mask = torch.full((L, L), torch.finfo(q.dtype).min, dtype=q.dtype).triu(1)
    w = torch.nn.functional.softmax(w + mask, dim=-1, dtype=torch.float32).to(q.dtype)
    o = torch.matmul(w, vh).transpose(1, 2).contiguous()
    return o.reshape(B * L, Hq * D)
