#!/usr/bin/env python3
"""bench_attention_torch.py — torch eager attention's fp32 CPU speed on
bench_attention's shapes.

Called by `bench_attention --torch` (which passes its shapes and thread
counts), or by hand:
    python3 bench/bench_attention_torch.py --threads 1,2 --shapes 1:512:8:2:128,8:128:4:2:64
A shape is B:L:Hq:Hkv:D. The computation is transformers'
eager_attention_forward as dev/attention_vs_torch.py writes it (repeat_kv,
matmul(q, k^T) * head_dim**-0.5, additive causal mask of finfo.min, fp32
softmax, matmul with v, the transposes to and from the token-major
[T, H*D] layout), on inputs that require grad. "forward" times that with
autograd recording; "forward+backward" adds o.backward(dout). A time is
the median of --reps runs, each at least 50 ms of back-to-back calls after
a warm-up; the thread count is set with torch.set_num_threads. Output: one
line "torch SHAPE_INDEX THREADS FWD_SECONDS FWDBWD_SECONDS" per
measurement, after header lines starting with '#'.
"""
import argparse
import os
import sys

import torch

# the timing loop and eager attention, shared with dev/attention_vs_torch.py
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "dev"))
from bx_ctypes import eager, time_call  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--shapes", default="1:512:8:2:128,8:128:4:2:64")
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    print(f"# torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()}")
    for si, spec in enumerate(a.shapes.split(",")):
        B, L, Hq, Hkv, D = (int(x) for x in spec.split(":"))
        g = torch.Generator().manual_seed(1)
        T = B * L
        q = (torch.rand(T, Hq * D, generator=g) * 2 - 1).requires_grad_(True)
        k = (torch.rand(T, Hkv * D, generator=g) * 2 - 1).requires_grad_(True)
        v = (torch.rand(T, Hkv * D, generator=g) * 2 - 1).requires_grad_(True)
        do = torch.rand(T, Hq * D, generator=g) * 2 - 1

        def fwd():
            return eager(q, k, v, B, L, Hq, Hkv, D)

        def fwdbwd():
            q.grad = k.grad = v.grad = None
            eager(q, k, v, B, L, Hq, Hkv, D).backward(do)

        for t in (int(x) for x in a.threads.split(",")):
            torch.set_num_threads(t)
            tf = time_call(fwd, a.reps, 0.05)
            tfb = time_call(fwdbwd, a.reps, 0.05)
            print(f"torch {si} {t} {tf:.6e} {tfb:.6e}", flush=True)


if __name__ == "__main__":
    main()
