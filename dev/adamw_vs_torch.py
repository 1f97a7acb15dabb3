#!/usr/bin/env python3
"""dev/adamw_vs_torch.py — bx_adamw_step (build/libbitexact.so, via ctypes)
against torch.optim.AdamW(foreach=False) on CPU, bit for bit, over several
steps on the same gradients; also the elementwise calls against torch's.

    python3 dev/adamw_vs_torch.py [path/to/libbitexact.so]

Prints per configuration the number of elements whose parameter, exp_avg,
exp_avg_sq bits differ after each step and the largest ulp distance;
exit status 1 on any difference in the AdamW comparison. (The Python
package has no binding for bitexact_train.h yet, hence ctypes and dev/.)
"""
import ctypes as C
import os
import sys

import numpy as np
import torch

# the DLPack structs in ctypes (shared with the Python tests) and the helpers of dev/
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bx_ctypes import DLTensor, dl_np, load, ulps  # noqa: E402

lib = load()


class AdamWOpts(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("lr", C.c_double), ("beta1", C.c_double),
                ("beta2", C.c_double), ("eps", C.c_double), ("weight_decay", C.c_double),
                ("num_threads", C.c_int)]


lib.bx_adamw_step.argtypes = [C.POINTER(DLTensor)] * 4 + [C.c_int64, C.POINTER(AdamWOpts)]
lib.bx_adamw_step.restype = C.c_int


def dl(a, keep):
    """A DLTensor over a contiguous float32 numpy array (keep holds the shape)."""
    return dl_np(a.reshape(-1), keep)


def compare(n, steps, lr, betas, eps, wd, seed, threads=0):
    g = torch.Generator().manual_seed(seed)
    p0 = torch.randn(n, generator=g)
    grads = [torch.randn(n, generator=g) * (10.0 ** float(k % 5 - 3)) for k in range(steps)]
    tp = p0.clone().requires_grad_(True)
    opt = torch.optim.AdamW([tp], lr=lr, betas=betas, eps=eps, weight_decay=wd, foreach=False)
    bp = p0.numpy().copy()
    bm = np.zeros(n, np.float32)
    bv = np.zeros(n, np.float32)
    keep = []
    tens = [dl(bp, keep), dl(grads[0].numpy(), keep), dl(bm, keep), dl(bv, keep)]
    o = AdamWOpts(C.sizeof(AdamWOpts), lr, betas[0], betas[1], eps, wd, threads)
    # the formula of bitexact_train.h in numpy (fmaf emulated in float64:
    # a*b of two floats is exact there; the one double rounding of the sum
    # could matter with probability ~2^-29), once with IEEE sqrt (must equal
    # bx_adamw_step) and once with torch's own fp32 sqrt (must equal torch
    # if the sqrt is the only difference)
    f = np.float32
    emu = {k: [p0.numpy().copy(), np.zeros(n, f), np.zeros(n, f)] for k in ("ieee", "torch")}

    def fma(a, b, c):
        return (a.astype(np.float64) * b.astype(np.float64) + c.astype(np.float64)).astype(f)

    def emulate(state, gr, t, sqrt):
        p, m, v = state
        b1, b2 = betas
        bc1 = 1 - b1 ** t
        bc2 = 1 - b2 ** t
        if wd != 0:
            p = p * f(1 - lr * wd)
        w = f(1 - b1)
        m = fma(np.full(n, w), gr - m, m) if abs(w) < 0.5 else fma(np.full(n, w - f(1)), gr - m, gr)
        v = fma(f(1 - b2) * gr, gr, v * f(b2))
        denom = sqrt(v) / f(bc2 ** 0.5) + f(eps)
        p = p + (f(-(lr / bc1)) * m) / denom
        state[:] = [p.astype(f), m.astype(f), v.astype(f)]

    emu_diff = {"ieee": 0, "torch": 0}
    diffs = 0
    for t in range(1, steps + 1):
        tp.grad = grads[t - 1].clone()
        opt.step()
        gn = grads[t - 1].numpy()
        tens[1] = dl(gn, keep)
        st = lib.bx_adamw_step(*[C.byref(x) for x in tens], t, C.byref(o))
        if st != 0:
            raise RuntimeError(lib.bx_last_error().decode())
        s = opt.state[tp]
        tp_n = tp.detach().numpy()
        emulate(emu["ieee"], gn, t, np.sqrt)
        emulate(emu["torch"], gn, t, lambda a: torch.from_numpy(a).sqrt().numpy())
        for k, ref in (("ieee", (bp, bm, bv)), ("torch", (tp_n, s["exp_avg"].numpy(),
                                                         s["exp_avg_sq"].numpy()))):
            for a, b in zip(emu[k], ref):
                emu_diff[k] += int((a.view(np.int32) != b.view(np.int32)).sum())
        for name, mine, theirs in (("param", bp, tp_n), ("exp_avg", bm, s["exp_avg"].numpy()),
                                   ("exp_avg_sq", bv, s["exp_avg_sq"].numpy())):
            u = ulps(mine, theirs)
            d = int((mine.view(np.int32) != theirs.view(np.int32)).sum())
            diffs += d
            if d:
                print(f"    step {t} {name}: {d} of {n} differ, max {int(u.max())} ulp")
    print(f"    formula with IEEE sqrt vs bx_adamw_step: {emu_diff['ieee']} differences; "
          f"formula with torch's sqrt vs torch: {emu_diff['torch']} differences")
    print(f"    torch.sqrt vs IEEE sqrt on the final exp_avg_sq: "
          f"{int((np.sqrt(bv).view(np.int32) != torch.from_numpy(bv).sqrt().numpy().view(np.int32)).sum())}"
          f" of {n} differ")
    print(f"  n={n} steps={steps} lr={lr} betas={betas} eps={eps} wd={wd} threads={threads}:"
          f" {'bitwise equal' if diffs == 0 else f'{diffs} element-steps differ'}")
    return diffs


def main():
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}")
    bad = 0
    for n in (1, 7, 16, 1000, 1 << 17):
        bad += compare(n, 10, 1e-3, (0.9, 0.999), 1e-8, 1e-2, seed=n)
    bad += compare(4099, 20, 3e-4, (0.8, 0.95), 1e-6, 0.1, seed=1)
    bad += compare(4099, 5, 1e-2, (0.3, 0.5), 0.0, 0.0, seed=2)   # lerp weight >= 0.5
    bad += compare(300001, 6, 1e-3, (0.9, 0.999), 1e-8, 1e-2, seed=3, threads=2)
    torch.set_num_threads(2)
    bad += compare(300001, 6, 1e-3, (0.9, 0.999), 1e-8, 1e-2, seed=3, threads=1)
    print("AdamW:", "bitwise equal to torch in every case" if bad == 0 else "DIFFERS")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
