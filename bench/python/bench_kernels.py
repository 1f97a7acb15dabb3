"""bench_kernels.py — the per-call cost of the training-kernel binding
(bitexact.kernels, docs/kernels_python.md "Overhead") on a tiny call,
against the same C call through ctypes and against torch's own ops, in one
run, one thread.

The call: rmsnorm_forward on x [4, 8], weight [8], into y [4, 8] and
rstd [4] (fp32), num_threads=1, torch.set_num_threads(1). Rows:

  binding, torch tensors     bitexact.kernels.rmsnorm_forward(x, w, eps, y, rstd)
  binding, numpy arrays      the same on numpy arrays
  ctypes, DLTensors once     bx_rmsnorm_forward through ctypes on DLTensors
                             built before the loop (the C call's own cost)
  ctypes, DLTensors per call the same, descriptors built from the torch
                             tensors in every call
  torch rms_norm             torch.nn.functional.rms_norm (not the same bits)
  torch eager formula        x * rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

Median of --reps runs of >= --min-s seconds each (dev/bx_ctypes.py's
time_call); the repetitions of the methods interleave, so a change of load
hits all of them. Ratios are against the ctypes-once row, measured in the
same run. It checks that the binding's outputs are bitwise the ctypes
call's before timing.

  python3 bench/python/bench_kernels.py [LIB] [--reps 7] [--min-s 0.2] [--json FILE]

LIB: libbitexact.so (default build/libbitexact.so, or $BITEXACT_LIB).
"""
import argparse
import ctypes as C
import json
import os
import statistics
import sys

import numpy as np
import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "dev"))
import bx_ctypes as X  # noqa: E402

from bitexact import kernels  # noqa: E402


class RmsOpts(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("num_threads", C.c_int)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("lib", nargs="?",
                    default=os.environ.get("BITEXACT_LIB") or os.path.join(ROOT, "build",
                                                                           "libbitexact.so"))
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--min-s", type=float, default=0.2)
    ap.add_argument("--json")
    a = ap.parse_args()
    torch.set_num_threads(1)
    kernels.use_fast_exporters()
    lib = X.load(a.lib)
    eps = 1e-5
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 8, generator=g)
    w = torch.randn(8, generator=g)
    y, rstd = torch.empty(4, 8), torch.empty(4)
    xn, wn = x.numpy().copy(), w.numpy().copy()
    yn, rn = np.empty((4, 8), np.float32), np.empty(4, np.float32)
    yc, rc = np.empty((4, 8), np.float32), np.empty(4, np.float32)
    opts = RmsOpts(C.sizeof(RmsOpts), 1)
    keep = []
    dl_once = [X.dl_np(t, keep) for t in (xn, wn, yc, rc)]
    f = lib.bx_rmsnorm_forward
    f.argtypes = [X.P, X.P, C.c_double, X.P, X.P, C.POINTER(RmsOpts)]

    def ctypes_once():
        st = f(C.byref(dl_once[0]), C.byref(dl_once[1]), eps, C.byref(dl_once[2]),
               C.byref(dl_once[3]), C.byref(opts))
        if st:
            raise RuntimeError(lib.bx_last_error().decode())

    def ctypes_per_call():
        k = []
        d = [X.dl_torch(t, k) for t in (x, w, y, rstd)]
        st = f(C.byref(d[0]), C.byref(d[1]), eps, C.byref(d[2]), C.byref(d[3]), C.byref(opts))
        if st:
            raise RuntimeError(lib.bx_last_error().decode())

    methods = {
        "binding, torch tensors": lambda: kernels.rmsnorm_forward(x, w, eps, y, rstd,
                                                                  num_threads=1),
        "binding, numpy arrays": lambda: kernels.rmsnorm_forward(xn, wn, eps, yn, rn,
                                                                 num_threads=1),
        "ctypes, DLTensors once": ctypes_once,
        "ctypes, DLTensors per call": ctypes_per_call,
        "torch rms_norm": lambda: torch.nn.functional.rms_norm(x, (8,), w, eps),
        "torch eager formula": lambda: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w,
    }
    # the binding's bits are the C call's (on the same inputs)
    ctypes_once()
    methods["binding, torch tensors"]()
    methods["binding, numpy arrays"]()
    for got in (y.numpy(), yn):
        if not np.array_equal(got.view(np.uint32), yc.view(np.uint32)):
            raise SystemExit("bench_kernels: the binding's y differs from the C call's")
    for got in (rstd.numpy(), rn):
        if not np.array_equal(got.view(np.uint32), rc.view(np.uint32)):
            raise SystemExit("bench_kernels: the binding's rstd differs from the C call's")
    runs = {k: [] for k in methods}
    for _ in range(a.reps):
        for k, fn in methods.items():
            runs[k].append(X.time_call(fn, 1, a.min_s))
    med = {k: statistics.median(v) * 1e6 for k, v in runs.items()}
    base = med["ctypes, DLTensors once"]
    print(f"rmsnorm_forward x[4, 8], 1 thread, median of {a.reps} runs of >= {a.min_s} s")
    print(f"{'call':30s} {'us/call':>9s} {'vs ctypes once':>15s}")
    for k, v in med.items():
        print(f"{k:30s} {v:9.2f} {v / base:14.2f}x")
    print(f"binding overhead over ctypes once: {med['binding, torch tensors'] - base:.2f} us "
          "(torch tensors)")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"us_per_call": med, "reps": a.reps}, fh, indent=1)


if __name__ == "__main__":
    main()
