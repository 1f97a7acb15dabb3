#!/usr/bin/env python3
"""bench_gemm_torch.py — torch.matmul's fp32 speed on bench_gemm's shapes.

Called by `bench_gemm --torch` (which passes its shapes and thread counts),
or by hand:
    python3 bench/bench_gemm_torch.py --threads 1,2 --shapes NT:1024:768:3072,NN:1024:3072:768
A shape is LAYOUT:M:K:N; NT times torch.matmul(x, w.t()) with w [N,K] (the
forward of nn.Linear without bias), NN torch.matmul(dy, w) with w [K,N]
row-major, TN the weight gradient torch.matmul(dy.t(), x) with dy [K,M] and
x [K,N] token-major (K = tokens: output [M,N], chains over the K tokens;
bx_gemm's BX_GEMM_TN with a = dy, b = x). Inputs are fp32 whatever bitexact's dtype (the ratio is to
torch's fp32). A time is the median of --reps runs, each at least 20 ms of
back-to-back calls after a warm-up; the thread count is set with
torch.set_num_threads. Output: one line "torch SHAPE_INDEX THREADS GFLOPS"
per measurement, after header lines starting with '#'.

With --bitexact LIB (a libbitexact.so) it also times bx_gemm through ctypes
on the same tensors (fp32, and bf16 inputs when --bf16), *interleaved* with
torch (one torch run, one bitexact run, and so on), so a machine shared
with other work slows both alike; it prints one line per shape and thread
count: GFLOP/s of each and the ratio bitexact / torch-fp32, and checks that
bx_gemm's result is within an fp32 bound of torch's.
"""
import ctypes
import argparse
import os
import statistics
import sys

import torch

# the DLPack structs, DLTensor views and the timing loop, shared with dev/
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "dev"))
from bx_ctypes import DLTensor, dl_torch, load, time_call  # noqa: E402


class GemmOpts(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("num_threads", ctypes.c_int),
                ("accumulate", ctypes.c_int)]


def interleaved(lib, args):
    lib.bx_gemm.restype = ctypes.c_int
    lib.bx_gemm.argtypes = [ctypes.POINTER(DLTensor), ctypes.POINTER(DLTensor), ctypes.c_int,
                            ctypes.POINTER(DLTensor), ctypes.POINTER(GemmOpts)]
    g = torch.Generator().manual_seed(1)
    print(f"{'shape':>18} {'in':>4} {'thr':>3} {'bitexact':>9} {'torch32':>8} {'ratio':>6}  (GFLOP/s, "
          f"medians of {args.reps} interleaved runs)", flush=True)
    for t in [int(x) for x in args.threads.split(",")]:
        torch.set_num_threads(t)
        for spec in args.shapes.split(","):
            lay, m, k, n = spec.split(":")
            m, k, n = int(m), int(k), int(n)
            a = torch.rand(k, m, generator=g) * 2 - 1 if lay == "TN" else torch.rand(m, k, generator=g) * 2 - 1
            w = torch.rand(n, k, generator=g) * 2 - 1 if lay == "NT" else torch.rand(k, n, generator=g) * 2 - 1
            out = torch.empty(m, n)
            tfn = {"NT": lambda: torch.matmul(a, w.t(), out=out), "NN": lambda: torch.matmul(a, w, out=out),
                   "TN": lambda: torch.matmul(a.t(), w, out=out)}[lay]
            aop = (lambda t: t.t()) if lay == "TN" else (lambda t: t)
            for dt in (["f32", "bf16"] if args.bf16 else ["f32"]):
                ab, wb = (a, w) if dt == "f32" else (a.bfloat16(), w.bfloat16())
                c = torch.empty(m, n)
                keep = []
                da, dw, dc = (dl_torch(x, keep) for x in (ab, wb, c))
                opts = GemmOpts(ctypes.sizeof(GemmOpts), t, 0)
                layout = {"NT": 0, "NN": 1, "TN": 2}[lay]

                def bfn():
                    st = lib.bx_gemm(ctypes.byref(da), ctypes.byref(dw), layout, ctypes.byref(dc), ctypes.byref(opts))
                    if st != 0:
                        raise RuntimeError(lib.bx_last_error().decode())
                bfn()
                tfn()
                ref = out.clone() if dt == "f32" else (aop(ab.float()) @ (wb.float().t() if lay == "NT" else wb.float()))
                err = (c - ref).abs().max().item()
                bound = k * 2.0 ** -23 * (aop(ab.float()).abs() @ (wb.float().abs().t() if lay == "NT" else wb.float().abs())).max().item()
                if not err <= bound:
                    raise SystemExit(f"bx_gemm differs from torch by {err} > {bound} on {spec} {dt}")
                tb, tt = [], []
                for _ in range(args.reps):
                    tt.append(time_call(tfn, 1, 0.02))
                    tb.append(time_call(bfn, 1, 0.02))
                fl = 2.0 * m * n * k * 1e-9
                gb, gt = fl / statistics.median(tb), fl / statistics.median(tt)
                print(f"{spec:>18} {dt:>4} {t:>3} {gb:9.1f} {gt:8.1f} {gb / gt:6.2f}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--shapes", default="NT:1024:256:256,NT:1024:256:1024,NT:1024:512:256,"
                    "NT:128:256:256,NT:128:128:256,NN:1024:1024:256,NT:1024:768:3072,"
                    "NT:1024:768:768,NN:1024:3072:768")
    ap.add_argument("--bitexact", metavar="LIB", help="libbitexact.so: time bx_gemm interleaved")
    ap.add_argument("--bf16", action="store_true", help="with --bitexact: bf16 inputs too")
    args = ap.parse_args()
    print(f"# torch {torch.__version__}, MKL {torch.backends.mkl.is_available()}, "
          f"oneDNN {torch.backends.mkldnn.is_available()}, fp32 matmul, "
          f"float32_matmul_precision {torch.get_float32_matmul_precision()}", flush=True)
    if args.bitexact:
        interleaved(load(args.bitexact), args)
        return
    g = torch.Generator().manual_seed(1)
    for t in [int(x) for x in args.threads.split(",")]:
        torch.set_num_threads(t)
        for i, spec in enumerate(args.shapes.split(",")):
            lay, m, k, n = spec.split(":")
            m, k, n = int(m), int(k), int(n)
            a = torch.rand(m, k, generator=g) * 2 - 1
            if lay == "TN":
                a = torch.rand(k, m, generator=g) * 2 - 1
                w = torch.rand(k, n, generator=g) * 2 - 1
                out = torch.empty(m, n)
                fn = lambda: torch.matmul(a.t(), w, out=out)  # noqa: E731
            elif lay == "NT":
                w = torch.rand(n, k, generator=g) * 2 - 1
                out = torch.empty(m, n)
                fn = lambda: torch.matmul(a, w.t(), out=out)  # noqa: E731
            else:
                w = torch.rand(k, n, generator=g) * 2 - 1
                out = torch.empty(m, n)
                fn = lambda: torch.matmul(a, w, out=out)  # noqa: E731
            with torch.no_grad():
                sec = time_call(fn, args.reps, 0.02)
            print(f"torch {i} {t} {2.0 * m * n * k / sec * 1e-9:.3f}", flush=True)


if __name__ == "__main__":
    main()
