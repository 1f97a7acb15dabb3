"""The calls of tests/python/test_kernels.py: for each bound kernel, builders of
its arguments in the C order (numpy arrays, scalars, None), which of them
are outputs, the binding's keyword options and the same options as the C
struct, so that one list drives both the binding (bitexact.kernels) and the
C library called directly through ctypes (libbitexact.so)."""
import ctypes as C

import numpy as np


# ---- the C option structs (bitexact_train.h), field for field ----------
class GemmOpts(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("num_threads", C.c_int), ("accumulate", C.c_int)]


class AdamWOpts(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("lr", C.c_double), ("beta1", C.c_double),
                ("beta2", C.c_double), ("eps", C.c_double), ("weight_decay", C.c_double),
                ("num_threads", C.c_int)]


class RouterOpts(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("num_threads", C.c_int), ("n_group", C.c_int64),
                ("topk_group", C.c_int64), ("norm_topk_prob", C.c_int),
                ("routed_scaling_factor", C.c_double)]


class XentOpts(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("num_threads", C.c_int),
                ("ignore_index", C.c_int64), ("grad_scale", C.c_double)]


class EmbOpts(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("num_threads", C.c_int),
                ("padding_idx", C.c_int64)]


def opts(cls, **fields):
    o = cls()
    o.struct_size = C.sizeof(cls)
    for k, v in fields.items():
        setattr(o, k, v)
    return o


# ---- data ---------------------------------------------------------------
def f32(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def out(*shape, dtype=np.float32):
    """An output, filled with a pattern the kernels never produce by chance."""
    return np.full(shape, -7, dtype=dtype) if dtype != np.float32 else \
        np.full(shape, 12345.678, dtype=np.float32)


def topk(rng, T, E, k, dtype=np.int64):
    """Distinct expert ids per token, ascending (the router's order)."""
    return np.array([np.sort(rng.choice(E, k, replace=False)) for _ in range(T)], dtype=dtype)


def plan(ids):
    """A dispatch plan (row_map, pos) of topk ids, rows sorted by (expert, t)."""
    T, k = ids.shape
    rows = sorted((int(ids[t, j]), t, j) for t in range(T) for j in range(k))
    row_map = np.array([[t, j] for _, t, j in rows], dtype=np.int64).reshape(-1, 2)
    pos = np.empty((T, k), dtype=np.int64)
    for r, (_, t, j) in enumerate(rows):
        pos[t, j] = r
    return row_map, pos


def nch(T, c):
    return (T + c - 1) // c


# ---- the cases: name -> builder(rng, n, lib) -> spec ---------------------
# spec: fn (binding name; default the case name up to '@'), c (C name),
# sig (C argument kinds: T tensor, L int64, d double, i int, O opts),
# args (C order, no opts), outs (indices of outputs), kw (binding options),
# copts (the C struct or None = defaults).
CASES = {}


def case(name):
    def deco(f):
        CASES[name] = f
        return f
    return deco


for _ew in ("exp", "log", "sigmoid", "silu", "rsqrt", "sin", "cos"):
    def _b(rng, n, lib, _ew=_ew):
        x = f32(rng, n, 3, scale=4.0)
        if _ew in ("log", "rsqrt"):
            x = np.abs(x)
        return dict(sig="TTO", args=[x, out(n, 3)], outs=[1])
    CASES[_ew] = _b


@case("adamw_step")
def _adamw(rng, n, lib):
    return dict(sig="TTTTLO", args=[f32(rng, n, 4), f32(rng, n, 4), f32(rng, n, 4),
                                    np.abs(f32(rng, n, 4)), 3], outs=[0, 2, 3])


@case("adamw_step@opts")
def _adamw2(rng, n, lib):
    d = _adamw(rng, n, lib)
    d["kw"] = dict(lr=0.05, beta1=0.8, beta2=0.99, eps=1e-6, weight_decay=0.1, num_threads=2)
    d["copts"] = opts(AdamWOpts, lr=0.05, beta1=0.8, beta2=0.99, eps=1e-6, weight_decay=0.1,
                      num_threads=2)
    return d


@case("gemm@nt")
def _gemm_nt(rng, n, lib):
    M, N, K = n, n + 2, 2 * n + 1
    return dict(sig="TTiTO", args=[f32(rng, M, K), f32(rng, N, K), 0, out(M, N)], outs=[3])


@case("gemm@nn")
def _gemm_nn(rng, n, lib):
    M, N, K = n + 1, n, 3
    return dict(sig="TTiTO", args=[f32(rng, M, K), f32(rng, K, N), 1, out(M, N)], outs=[3])


@case("gemm@tn_acc")
def _gemm_tn(rng, n, lib):
    T, N, K = 2 * n, n, n + 3
    return dict(sig="TTiTO", args=[f32(rng, T, N), f32(rng, T, K), 2, f32(rng, N, K)], outs=[3],
                kw=dict(accumulate=True), copts=opts(GemmOpts, accumulate=1))


@case("rmsnorm_forward")
def _rms_f(rng, n, lib):
    T, H = n, n + 4
    return dict(sig="TTdTTO", args=[f32(rng, T, H), f32(rng, H), 1e-5, out(T, H), out(T)],
                outs=[3, 4])


@case("rmsnorm_backward")
def _rms_b(rng, n, lib):
    T, H = n + 1, 6
    rstd = np.abs(f32(rng, T)) + 0.5
    return dict(sig="TTTTLTTO", args=[f32(rng, T, H), f32(rng, H), f32(rng, T, H), rstd, 2,
                                      out(T, H), out(nch(T, 2), H)], outs=[5, 6])


def _rope_args(rng, n):
    T = n + 1
    return T, f32(rng, T, 2 * 8), (np.arange(T, dtype=np.int64) * 37) % 1000


@case("rope_forward")
def _rope_f(rng, n, lib):
    T, x, p = _rope_args(rng, n)
    return dict(sig="TTLLdTO", args=[x, p, 8, 4, 10000.0, out(T, 16)], outs=[5])


@case("rope_backward")
def _rope_b(rng, n, lib):
    T, x, p = _rope_args(rng, n)
    return dict(sig="TTLLdTO", args=[x, p, 8, 6, 500000.0, out(T, 16)], outs=[5])


@case("rope_cos_sin")
def _rope_cs(rng, n, lib):
    T, _, p = _rope_args(rng, n)
    return dict(sig="TLdTTO", args=[p, 4, 10000.0, out(T, 2), out(T, 2)], outs=[3, 4])


@case("swiglu_forward")
def _sw_f(rng, n, lib):
    return dict(sig="TTTO", args=[f32(rng, n, 5), f32(rng, n, 5), out(n, 5)], outs=[2])


@case("swiglu_forward_fused")
def _sw_ff(rng, n, lib):
    return dict(sig="TTO", args=[f32(rng, n, 10), out(n, 5)], outs=[1])


@case("swiglu_backward")
def _sw_b(rng, n, lib):
    return dict(sig="TTTTTO", args=[f32(rng, n, 5), f32(rng, n, 5), f32(rng, n, 5), out(n, 5),
                                    out(n, 5)], outs=[3, 4])


@case("swiglu_backward_fused")
def _sw_bf(rng, n, lib):
    return dict(sig="TTTO", args=[f32(rng, n, 10), f32(rng, n, 5), out(n, 10)], outs=[2])


def _attn_qkv(rng, n):
    B, L, Hq, Hkv, D = 2, n + 1, 4, 2, 8
    T = B * L
    return T, L, Hq, Hkv, D, f32(rng, T, Hq * D), f32(rng, T, Hkv * D), f32(rng, T, Hkv * D)


@case("attention_forward")
def _attn_f(rng, n, lib):
    T, L, Hq, Hkv, D, q, k, v = _attn_qkv(rng, n)
    return dict(sig="TTTLLLLTTO", args=[q, k, v, L, Hq, Hkv, D, out(T, Hq * D), out(T, Hq, 2)],
                outs=[7, 8])


@case("attention_backward")
def _attn_b(rng, n, lib):
    T, L, Hq, Hkv, D, q, k, v = _attn_qkv(rng, n)
    stats = np.zeros((T, Hq, 2), np.float32)
    call_c(lib, "bx_attention_forward", "TTTLLLLTTO",
           [q, k, v, L, Hq, Hkv, D, np.zeros((T, Hq * D), np.float32), stats])
    return dict(sig="TTTTTLLLLTTTO",
                args=[f32(rng, T, Hq * D), q, k, v, stats, L, Hq, Hkv, D, out(T, Hq * D),
                      out(T, Hkv * D), out(T, Hkv * D)], outs=[9, 10, 11])


@case("moe_router_forward")
def _router_f(rng, n, lib):
    T, E, k = n + 2, 8, 2
    return dict(sig="TTTTLTO", args=[f32(rng, T, E), f32(rng, E, scale=0.1),
                                     out(T, k, dtype=np.int64), out(T, k), 2,
                                     out(nch(T, 2), E, dtype=np.int64)], outs=[2, 3, 5])


@case("moe_router_forward@opts")
def _router_f2(rng, n, lib):
    T, E, k = n + 2, 8, 3
    return dict(sig="TTTTLTO", args=[f32(rng, T, E), f32(rng, E, scale=0.1),
                                     out(T, k, dtype=np.int32), out(T, k), 3, None],
                outs=[2, 3], kw=dict(n_group=4, topk_group=2, norm_topk_prob=False,
                                     routed_scaling_factor=2.5),
                copts=opts(RouterOpts, n_group=4, topk_group=2, norm_topk_prob=0,
                           routed_scaling_factor=2.5))


@case("moe_router_backward")
def _router_b(rng, n, lib):
    T, E, k = n + 2, 8, 2
    return dict(sig="TTTTO", args=[f32(rng, T, E), topk(rng, T, E, k), f32(rng, T, k),
                                   out(T, E)], outs=[3])


@case("moe_bias_update")
def _bias_upd(rng, n, lib):
    E = 6
    return dict(sig="TTd", args=[f32(rng, E), rng.integers(0, 9, (n, E)).astype(np.int64),
                                 0.125], outs=[0])


@case("moe_dispatch_plan")
def _plan(rng, n, lib):
    T, E, k = n + 1, 6, 2
    tok = np.sort(rng.choice(100, T, replace=False)).astype(np.int64)
    return dict(sig="TTTTTO", args=[topk(rng, T, E, k, np.int32), tok, out(E + 1, dtype=np.int64),
                                    out(T * k, 2, dtype=np.int64), out(T, k, dtype=np.int64)],
                outs=[2, 3, 4])


@case("moe_dispatch_plan@none")
def _plan2(rng, n, lib):
    d = _plan(rng, n, lib)
    d["args"][1] = None
    return d


@case("moe_dispatch_order")
def _order(rng, n, lib):
    m, E = 3 * n + 1, 5
    return dict(sig="TTTT", args=[rng.integers(0, E, m).astype(np.int64),
                                  rng.permutation(m).astype(np.int64),
                                  out(E + 1, dtype=np.int64), out(m, dtype=np.int64)],
                outs=[2, 3])


@case("moe_expert_chunks")
def _echunks(rng, n, lib):
    C_, cb, m = 4, 2, n + 1
    ids = np.sort(rng.choice(np.arange(cb * C_, (cb + m) * C_), n + 1, replace=False))
    return dict(sig="TLLT", args=[ids.astype(np.int64), C_, cb, out(m + 1, dtype=np.int64)],
                outs=[3])


def _moe_data(rng, n):
    T, E, k, H = n + 1, 5, 2, 4
    ids = topk(rng, T, E, k)
    row_map, pos = plan(ids)
    return T, k, H, row_map, pos


@case("moe_permute")
def _perm(rng, n, lib):
    T, k, H, rm, pos = _moe_data(rng, n)
    return dict(sig="TTTO", args=[f32(rng, T, H), rm, out(T * k, H)], outs=[2])


@case("moe_permute_backward")
def _perm_b(rng, n, lib):
    T, k, H, rm, pos = _moe_data(rng, n)
    return dict(sig="TTTTO", args=[f32(rng, T * k, H), rm, pos, out(T, H)], outs=[3])


@case("moe_unpermute")
def _unperm(rng, n, lib):
    T, k, H, rm, pos = _moe_data(rng, n)
    return dict(sig="TTTTTTO", args=[f32(rng, T * k, H), f32(rng, T, k), rm, pos,
                                     f32(rng, T, H), out(T, H)], outs=[5])


@case("moe_unpermute@noinit")
def _unperm2(rng, n, lib):
    d = _unperm(rng, n, lib)
    d["args"][4] = None
    return d


@case("moe_unpermute_backward")
def _unperm_b(rng, n, lib):
    T, k, H, rm, pos = _moe_data(rng, n)
    return dict(sig="TTTTTTTO", args=[f32(rng, T, H), f32(rng, T * k, H), f32(rng, T, k), rm,
                                      pos, out(T * k, H), out(T, k)], outs=[5, 6])


@case("embedding_forward")
def _emb_f(rng, n, lib):
    V, H, T = 7, 3, n + 2
    return dict(sig="TTTO", args=[f32(rng, V, H), rng.integers(0, V, T).astype(np.int32),
                                  out(T, H)], outs=[2])


@case("embedding_backward")
def _emb_b(rng, n, lib):
    V, H, T, C_ = 5, 3, n + 3, 2
    return dict(sig="TTLLTTTO",
                args=[rng.integers(0, V, T).astype(np.int64), f32(rng, T, H), V, C_,
                      out(T, dtype=np.int64), out(T, H), out(nch(T, C_) + 1, dtype=np.int64)],
                outs=[4, 5, 6], kw=dict(padding_idx=1), copts=opts(EmbOpts, padding_idx=1))


def _targets(rng, T, V, ignore=-100):
    t = rng.integers(0, V, T).astype(np.int64)
    t[rng.random(T) < 0.25] = ignore
    return t


@case("xent_forward")
def _xent_f(rng, n, lib):
    T, V = n + 2, 11
    return dict(sig="TTLTTTO", args=[f32(rng, T, V, scale=3.0), _targets(rng, T, V), 2,
                                     out(T), out(nch(T, 2)), out(nch(T, 2), dtype=np.int64)],
                outs=[3, 4, 5])


@case("xent_backward")
def _xent_b(rng, n, lib):
    T, V = n + 2, 11
    return dict(sig="TTLTO", args=[f32(rng, T, V), _targets(rng, T, V, -1), T + 3, out(T, V)],
                outs=[3], kw=dict(ignore_index=-1, grad_scale=0.5),
                copts=opts(XentOpts, ignore_index=-1, grad_scale=0.5))


@case("xent_forward_backward")
def _xent_fb(rng, n, lib):
    T, V = n + 2, 9
    return dict(sig="TTLLTTTTO", args=[f32(rng, T, V), _targets(rng, T, V).astype(np.int32),
                                       T, 3, out(T), out(nch(T, 3)),
                                       out(nch(T, 3), dtype=np.int64), out(T, V)],
                outs=[4, 5, 6, 7])


@case("xent_count")
def _xent_c(rng, n, lib):
    T = n + 4
    return dict(sig="TLTO", args=[_targets(rng, T, 5), 3, out(nch(T, 3), dtype=np.int64)],
                outs=[2])


@case("bias_grad_partials")
def _bias_p(rng, n, lib):
    T, N = 2 * n + 1, 5
    return dict(sig="TLTO", args=[f32(rng, T, N), 2, out(nch(T, 2), N)], outs=[2])


# ---- calling the C library directly -------------------------------------
_NP = {np.dtype(np.float32): (2, 32), np.dtype(np.float64): (2, 64),
       np.dtype(np.int64): (0, 64), np.dtype(np.int32): (0, 32)}


def dl_np(a, keep):
    """A host DLTensor (dlpack_ctypes.DLTensor) over a C-contiguous numpy array."""
    from dlpack_ctypes import DLDataType, DLDevice, DLTensor
    code, bits = _NP[a.dtype]
    shape = (C.c_int64 * max(a.ndim, 1))(*a.shape)
    keep += [shape, a]
    return DLTensor(a.ctypes.data, DLDevice(1, 0), a.ndim, DLDataType(code, bits, 1),
                    C.cast(shape, C.POINTER(C.c_int64)), None, 0)


def call_c(lib, cname, sig, args, copts=None):
    """lib.cname(*args) with the kinds of sig; raises AssertionError with
    bx_last_error() unless it returns BX_OK."""
    keep, cargs = [], []
    vals = list(args) + ([copts] if sig.endswith("O") else [])
    for kind, v in zip(sig, vals):
        if kind == "T":
            cargs.append(None if v is None else C.byref(dl_np(v, keep)))
        elif kind == "L":
            cargs.append(C.c_int64(v))
        elif kind == "d":
            cargs.append(C.c_double(v))
        elif kind == "i":
            cargs.append(C.c_int(v))
        else:  # O
            cargs.append(None if v is None else C.byref(v))
    st = getattr(lib, cname)(*cargs)
    assert st == 0, f"{cname}: status {st}: {lib.bx_last_error().decode()}"
