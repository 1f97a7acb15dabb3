#!/usr/bin/env python3
"""dev/layers_vs_torch.py — the layer kernels of bitexact_train.h
(build/libbitexact.so, via ctypes) against torch eager on CPU, written as
transformers' modeling_glm4_moe.py writes them:

  SwiGLU   F.silu(g) * u and its autograd gradients: h and dup equal
           wherever torch's fp32 SiLU (x / (1 + exp(-x)), SLEEF exp) is
           correctly rounded (asserted); dgate: the count of equal elements
           where torch's sigmoid is correctly rounded (torch's kernel forms
           1 + x (1 - s) with an fma, as bitexact does); ulp distances.
  RoPE     Glm4MoeRotaryEmbedding's cos/sin tables (inv_freq via fp32 pow,
           fp32 product, fp32 cos/sin) against bx_rope_cos_sin (ulp
           distances), and apply_rotary_pos_emb (rotate_half, partial
           rotary) evaluated by torch on bitexact's tables against
           bx_rope_forward / bx_rope_backward: equal bits (asserted).
  RMSNorm  Glm4MoeRMSNorm against bx_rmsnorm_forward: ulp distances (torch
           sums the squares in its own vectorised order and rounds rsqrt
           twice; not expected to be equal).

    python3 dev/layers_vs_torch.py [path/to/libbitexact.so]

Exit status 1 when an asserted equality fails.
"""
import ctypes as C
import os
import sys

import numpy as np
import torch
import torch.nn.functional as Fn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
from dlpack_ctypes import DLDataType, DLDevice, DLTensor  # noqa: E402

LIB = sys.argv[1] if len(sys.argv) > 1 else "build/libbitexact.so"
lib = C.CDLL(LIB)
lib.bx_last_error.restype = C.c_char_p
P = C.POINTER(DLTensor)
for name, args in {
    "bx_swiglu_forward": [P, P, P, C.c_void_p],
    "bx_swiglu_backward": [P, P, P, P, P, C.c_void_p],
    "bx_rope_forward": [P, P, C.c_int64, C.c_int64, C.c_double, P, C.c_void_p],
    "bx_rope_backward": [P, P, C.c_int64, C.c_int64, C.c_double, P, C.c_void_p],
    "bx_rope_cos_sin": [P, C.c_int64, C.c_double, P, P, C.c_void_p],
    "bx_rmsnorm_forward": [P, P, C.c_double, P, P, C.c_void_p],
}.items():
    getattr(lib, name).argtypes = args
    getattr(lib, name).restype = C.c_int

keep = []
failed = False


def dl(a):
    """A DLTensor over a C-contiguous float32 / int64 numpy array."""
    assert a.flags["C_CONTIGUOUS"]
    shape = (C.c_int64 * a.ndim)(*a.shape)
    keep.append((shape, a))
    dt = DLDataType(0, 64, 1) if a.dtype == np.int64 else DLDataType(2, 32, 1)
    return C.byref(DLTensor(a.ctypes.data, DLDevice(1, 0), a.ndim, dt, shape, None, 0))


def call(name, *args):
    st = getattr(lib, name)(*args, None)
    if st != 0:
        raise RuntimeError(f"{name}: {st}: {lib.bx_last_error().decode()}")


def ulps(a, b):
    ia = np.ascontiguousarray(a, np.float32).view(np.int32).astype(np.int64)
    ib = np.ascontiguousarray(b, np.float32).view(np.int32).astype(np.int64)
    ia = np.where(ia < 0, -(ia & 0x7FFFFFFF), ia)
    ib = np.where(ib < 0, -(ib & 0x7FFFFFFF), ib)
    return np.abs(ia - ib)


def report(what, a, b):
    d = ulps(a, b)
    n = d.size
    print(f"  {what:34s} equal {np.count_nonzero(d == 0):8d}/{n}  max ulp {d.max():3d}  "
          f"(1 ulp: {np.count_nonzero(d == 1)}, >1: {np.count_nonzero(d > 1)})")
    return d


def check(ok, what):
    global failed
    if not ok:
        failed = True
        print(f"  FAILED: {what}")


def swiglu(seed):
    print("SwiGLU: F.silu(g) * u, autograd")
    gen = torch.Generator().manual_seed(seed)
    t, f = 512, 1408
    g = (torch.randn(t, f, generator=gen) * 4).contiguous()
    u = torch.randn(t, f, generator=gen)
    dh = torch.randn(t, f, generator=gen)
    gn, un, dhn = g.numpy(), u.numpy(), dh.numpy()
    h = np.empty_like(gn)
    call("bx_swiglu_forward", dl(gn), dl(un), dl(h))
    silu_bx = np.empty_like(gn)
    call("bx_swiglu_forward", dl(gn), dl(np.ones_like(gn)), dl(silu_bx))  # SiLU itself
    gt = g.clone().requires_grad_(True)
    ut = u.clone().requires_grad_(True)
    ht = Fn.silu(gt) * ut
    ht.backward(dh)
    silu_t = Fn.silu(g).numpy()
    ds = report("torch SiLU vs correctly rounded", silu_t, silu_bx)
    dh_ = report("h = silu(g) * u", ht.detach().numpy(), h)
    cr = ds == 0
    check(np.all(dh_[cr] == 0), "h equals torch's wherever torch's SiLU is correctly rounded")
    print(f"  h equal on all {np.count_nonzero(cr)} elements where torch's SiLU is correctly rounded")
    dg, du = np.empty_like(gn), np.empty_like(gn)
    call("bx_swiglu_backward", dl(gn), dl(un), dl(dhn), dl(dg), dl(du))
    report("dgate (silu_backward)", gt.grad.numpy(), dg)
    ddu = report("dup = dh * silu(g)", ut.grad.numpy(), du)
    check(np.all(ddu[cr] == 0), "dup equals torch's wherever torch's SiLU is correctly rounded")
    # torch's sigmoid inside silu_backward: 1 / (1 + exp(-x)) in fp32
    sig_t = (1.0 / (1.0 + torch.exp(-g))).numpy()
    lib.bx_sigmoid_f32.restype = C.c_float
    lib.bx_sigmoid_f32.argtypes = [C.c_float]
    sig_bx = np.vectorize(lambda x: lib.bx_sigmoid_f32(float(x)), otypes=[np.float32])(gn)
    dsg = report("torch 1/(1+exp(-x)) vs CR sigmoid", sig_t, sig_bx)
    ok = (dsg == 0) & cr
    ddg = ulps(gt.grad.numpy(), dg)
    print(f"  dgate equal on {np.count_nonzero(ddg[ok] == 0)}/{np.count_nonzero(ok)} elements where "
          f"torch's sigmoid and SiLU are correctly rounded")


def rope(seed, theta, head_dim=128, factor=0.5, heads=12):
    rd = int(head_dim * factor)
    print(f"RoPE: head_dim {head_dim}, rotary_dim {rd}, rope_theta {theta:g}")
    gen = torch.Generator().manual_seed(seed)
    t = 4096
    pos = torch.arange(t, dtype=torch.int64)
    # Glm4MoeRotaryEmbedding.compute_default_rope_parameters and forward
    inv_freq = 1.0 / (theta ** (torch.arange(0, rd, 2, dtype=torch.int64).to(dtype=torch.float) / rd))
    freqs = (inv_freq[None, :, None].float() @ pos[None, None, :].float()).transpose(1, 2)[0]
    cos_t, sin_t = freqs.cos().numpy(), freqs.sin().numpy()
    posn = pos.numpy().copy()
    cos_b = np.empty((t, rd // 2), np.float32)
    sin_b = np.empty((t, rd // 2), np.float32)
    call("bx_rope_cos_sin", dl(posn), rd, theta, dl(cos_b), dl(sin_b))
    report("cos table (torch vs bitexact)", cos_t, cos_b)
    report("sin table (torch vs bitexact)", sin_t, sin_b)
    # apply_rotary_pos_emb (transformers) on bitexact's tables
    x = torch.randn(t, heads, head_dim, generator=gen)
    cos = torch.from_numpy(np.concatenate([cos_b, cos_b], -1))[:, None, :]
    sin = torch.from_numpy(np.concatenate([sin_b, sin_b], -1))[:, None, :]

    def rotate_half(v):
        return torch.cat((-v[..., v.shape[-1] // 2:], v[..., : v.shape[-1] // 2]), dim=-1)

    xt = x.clone().requires_grad_(True)
    q_rot, q_pass = xt[..., :rd], xt[..., rd:]
    y_t = torch.cat([(q_rot * cos) + (rotate_half(q_rot) * sin), q_pass], dim=-1)
    dy = torch.randn(t, heads, head_dim, generator=gen)
    y_t.backward(dy)
    xn = x.numpy().copy()
    y_b = np.empty_like(xn)
    call("bx_rope_forward", dl(xn), dl(posn), head_dim, rd, theta, dl(y_b))
    d = report("rotation on the same tables", y_t.detach().numpy(), y_b)
    check(np.all(d == 0), "bx_rope_forward equals transformers' apply_rotary_pos_emb")
    dx_b = np.empty_like(xn)
    call("bx_rope_backward", dl(dy.numpy().copy()), dl(posn), head_dim, rd, theta, dl(dx_b))
    d = report("backward (autograd) on the same tables", xt.grad.numpy(), dx_b)
    check(np.all(d == 0), "bx_rope_backward equals torch's autograd")


def rmsnorm(seed, hidden=4096, eps=1e-5):
    print(f"RMSNorm: hidden {hidden}, eps {eps:g}")
    gen = torch.Generator().manual_seed(seed)
    t = 256
    x = torch.randn(t, hidden, generator=gen)
    w = 1 + 0.1 * torch.randn(hidden, generator=gen)
    var = x.pow(2).mean(-1, keepdim=True)
    y_t = w * (x * torch.rsqrt(var + eps))
    xn, wn = x.numpy().copy(), w.numpy().copy()
    y_b = np.empty_like(xn)
    rs = np.empty(t, np.float32)
    call("bx_rmsnorm_forward", dl(xn), dl(wn), eps, dl(y_b), dl(rs))
    report("rstd (torch.rsqrt vs CR)", torch.rsqrt(var + eps).numpy()[:, 0], rs)
    report("y", y_t.numpy(), y_b)


torch.set_num_threads(1)
print(f"torch {torch.__version__}, {LIB}")
swiglu(1)
rope(2, 10000.0)
rope(3, 1000000.0)
rmsnorm(4)
rmsnorm(5, 128, 1e-5)  # the QK-norm width
sys.exit(1 if failed else 0)
