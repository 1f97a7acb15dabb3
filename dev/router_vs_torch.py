#!/usr/bin/env python3
"""dev/router_vs_torch.py — bx_moe_router_forward / _backward and
bx_moe_unpermute (build/libbitexact.so, via ctypes) against the routing of
transformers' Glm4MoeMoE written out in torch here (transformers itself is
not needed): sigmoid, + e_score_correction_bias, group score = sum of the
top-2 per group, topk of groups, masked_fill(-inf) (transformers 5.24), topk, gather,
normalise (+ 1e-20), * routed_scaling_factor; backward by autograd.

    python3 dev/router_vs_torch.py [path/to/libbitexact.so]

Prints per configuration: tokens whose expert SET differs (torch's topk
breaks ties its own way, so exact ties are avoided in the data; the ids are
compared after sorting, bitexact writes them ascending), the largest ulp
distance of the weights and of dlogits (relative to the row's largest
|dlogit|), and whether bx_moe_unpermute equals torch's expert loop
(zeros, index_add_ of y * w per expert ascending, + shared) bit for bit.
Also both against an fp64 reference on the same experts (ulp of the fp32
result; dlogits relative to the row's largest |g|). Exit status 1 if any
expert set or the combine differs, a bitexact weight is more than 3 ulp
from fp64, or a bitexact dlogit more than 1e-6 (relative) from fp64.
"""
import ctypes as C
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bx_ctypes import DLTensor, dl_np, load, ulps  # noqa: E402

lib = load()


class RouterOpts(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("num_threads", C.c_int), ("n_group", C.c_int64),
                ("topk_group", C.c_int64), ("norm_topk_prob", C.c_int),
                ("routed_scaling_factor", C.c_double)]


P = C.POINTER(DLTensor)
lib.bx_moe_router_forward.argtypes = [P, P, P, P, C.c_int64, P, C.POINTER(RouterOpts)]
lib.bx_moe_router_backward.argtypes = [P, P, P, P, C.POINTER(RouterOpts)]
lib.bx_moe_dispatch_plan.argtypes = [P, P, P, P, P, C.c_void_p]
lib.bx_moe_unpermute.argtypes = [P, P, P, P, P, P, C.c_void_p]
KEEP = []


def dl(a):
    a = np.ascontiguousarray(a)
    KEEP.append(a)
    return C.byref(dl_np(a, KEEP)), a


def ok(st, what):
    if st != 0:
        raise SystemExit(f"{what}: status {st}: {lib.bx_last_error().decode()}")


def route_torch(logits, bias, G, kg, k, norm, rsf):
    s = logits.sigmoid()
    c = s + bias
    E = logits.shape[1]
    gs = c.view(-1, G, E // G).topk(2, dim=-1)[0].sum(dim=-1)
    gidx = torch.topk(gs, k=kg, dim=-1, sorted=False)[1]
    gmask = torch.zeros_like(gs).scatter_(1, gidx, 1)
    smask = gmask.unsqueeze(-1).expand(-1, G, E // G).reshape(-1, E)
    cm = c.masked_fill(~smask.bool(), float("-inf"))
    idx = torch.topk(cm, k=k, dim=-1, sorted=False)[1]
    idx = idx.sort(dim=-1)[0]  # bitexact's order: ascending expert id
    w = s.gather(1, idx)
    if norm:
        w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
    return idx, w * rsf


def run(T, E, G, kg, k, norm, rsf, seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(T, E, generator=g) * 2.0
    bias = torch.randn(E, generator=g) * 0.1
    dw = torch.randn(T, k, generator=g)
    o = RouterOpts(C.sizeof(RouterOpts), 0, G, kg, norm, rsf)
    lt, _ = dl(logits.numpy())
    bt, _ = dl(bias.numpy())
    it, ids = dl(np.zeros((T, k), np.int64))
    wt, w = dl(np.zeros((T, k), np.float32))
    ok(lib.bx_moe_router_forward(lt, bt, it, wt, T, None, C.byref(o)), "forward")
    lg = logits.clone().requires_grad_(True)
    tid, tw = route_torch(lg, bias, G, kg, k, norm, rsf)
    (tw * dw).sum().backward()
    set_diff = int((torch.from_numpy(ids) != tid).any(dim=1).sum())
    same = (torch.from_numpy(ids) == tid).all(dim=1).numpy()
    wu = ulps(w[same], tw.detach().numpy()[same]).max(initial=0)
    # fp64 reference on the same experts: which of the two is nearer the real value
    s64 = logits.double().sigmoid().gather(1, torch.from_numpy(ids))
    if norm:
        s64 = s64 / (s64.sum(dim=-1, keepdim=True) + 1e-20)
    w64 = (s64 * rsf).numpy()
    ulp32 = np.spacing(np.abs(w64).astype(np.float32)).astype(np.float64)
    bx_err = (np.abs(w - w64) / ulp32)[same].max(initial=0.0)
    th_err = (np.abs(tw.detach().numpy().astype(np.float64) - w64) / ulp32)[same].max(initial=0.0)
    # dlogits against fp64 autograd
    l64 = logits.double().requires_grad_(True)
    _, w64t = route_torch(l64, bias.double(), G, kg, k, norm, rsf)
    (w64t * dw.double()).sum().backward()
    g64 = l64.grad.numpy()
    sc64 = np.abs(g64).max(axis=1, keepdims=True) + 1e-300
    dwt, _ = dl(dw.numpy())
    dlt, dlg = dl(np.zeros((T, E), np.float32))
    ok(lib.bx_moe_router_backward(lt, it, dwt, dlt, C.byref(o)), "backward")
    tg = lg.grad.numpy()
    scale = np.abs(tg).max(axis=1, keepdims=True) + 1e-30
    drel = (np.abs(dlg - tg) / scale)[same].max(initial=0.0)
    bx_drel = (np.abs(dlg - g64) / sc64)[same].max(initial=0.0)
    th_drel = (np.abs(tg - g64) / sc64)[same].max(initial=0.0)
    # combine: bitexact's unpermute vs torch's expert loop, on the same y and w
    H = 16
    y = torch.randn(T * k, H, generator=g)
    sh = torch.randn(T, H, generator=g)
    ot, offs = dl(np.zeros(E + 1, np.int64))
    rt, rmap = dl(np.zeros((T * k, 2), np.int64))
    pt, pos = dl(np.zeros((T, k), np.int64))
    ok(lib.bx_moe_dispatch_plan(it, None, ot, rt, pt, None), "plan")
    yt, _ = dl(y.numpy())
    sht, _ = dl(sh.numpy())
    outt, out = dl(np.zeros((T, H), np.float32))
    ok(lib.bx_moe_unpermute(yt, wt, rt, pt, sht, outt, None), "unpermute")
    tid_, tw_ = torch.from_numpy(ids), torch.from_numpy(w)
    final = torch.zeros(T, H)
    for e in range(E):
        tok, kpos = torch.where(tid_ == e)
        if len(tok) == 0:
            continue
        rows = torch.from_numpy(pos)[tok, kpos]
        final.index_add_(0, tok, y[rows] * tw_[tok, kpos, None])
    final = final + sh
    comb_same = bool(np.array_equal(final.numpy().view(np.int32), out.view(np.int32)))
    print(f"T {T} E {E} G {G} topk_group {kg} k {k} norm {norm} rsf {rsf}:\n"
          f"  expert sets differ: {set_diff} tokens; combine (unpermute vs index_add_ loop): "
          f"{'bitwise equal' if comb_same else 'DIFFERENT'}\n"
          f"  weights: bitexact vs torch max {wu} ulp; vs fp64: bitexact {bx_err:.2f} ulp, "
          f"torch {th_err:.2f} ulp\n"
          f"  dlogits (relative to the row's max |g|): bitexact vs torch {drel:.2e}; vs fp64: "
          f"bitexact {bx_drel:.2e}, torch {th_drel:.2e}")
    return set_diff == 0 and comb_same and bx_err <= 3.0 and bx_drel <= 1e-6


good = True
for cfg in [(4096, 16, 4, 2, 4, True, 2.5), (4096, 128, 1, 1, 8, True, 2.5),
            (2048, 64, 8, 4, 6, False, 1.0), (2048, 160, 1, 1, 8, True, 2.5)]:
    good &= run(*cfg, seed=len(cfg) + cfg[0] + cfg[1])
sys.exit(0 if good else 1)
