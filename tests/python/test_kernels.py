"""bitexact.kernels, the binding of the training kernels: for every bound
function the bits equal those of the C library called directly (ctypes over
libbitexact.so: $BITEXACT_LIB, else build/libbitexact.so), with torch
tensors and with numpy arrays, several shapes; bad input raises the right
exception naming the argument and leaves the outputs unchanged; capsules are
released once per call; the GIL is released; no reference or memory leak."""
import copy
import ctypes as C
import gc
import os
import sys
import threading
import time
import tracemalloc

import numpy as np
import pytest
import torch

import bitexact
from bitexact import kernels as K

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from dlpack_ctypes import KDLCUDA, Producer  # noqa: E402
from kernel_cases import CASES, call_c, dl_np, opts, GemmOpts  # noqa: E402,F401

ROOT = os.path.dirname(os.path.dirname(HERE))
LIB_PATH = os.environ.get("BITEXACT_LIB") or os.path.join(ROOT, "build", "libbitexact.so")


@pytest.fixture(scope="module")
def lib():
    if not os.path.exists(LIB_PATH):
        pytest.skip(f"{LIB_PATH} is not built (cmake -S . -B build -DBITEXACT_CUDA=OFF && "
                    f"cmake --build build --target bx_shared, or set BITEXACT_LIB)")
    lib = C.CDLL(LIB_PATH)
    lib.bx_last_error.restype = C.c_char_p
    return lib


def same(a, b):
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and \
        np.array_equal(a.view(np.uint8), b.view(np.uint8))


def clone(args):
    return [np.array(a, copy=True) if isinstance(a, np.ndarray) else a for a in args]


# ---- bits: the binding == the C library, numpy and torch ----------------
@pytest.mark.parametrize("n", [1, 3, 8])
@pytest.mark.parametrize("name", sorted(CASES))
def test_bits_equal_c_library(lib, name, n):
    spec = CASES[name](np.random.default_rng(hash((name, n)) % 2**32), n, lib)
    fn = spec.get("fn", name.split("@")[0])
    args, outs, kw = spec["args"], spec["outs"], spec.get("kw", {})
    ref = clone(args)
    call_c(lib, spec.get("c", "bx_" + fn), spec["sig"], ref, spec.get("copts"))
    assert any(not same(ref[i], args[i]) for i in outs), "the C call wrote nothing"
    with_np = clone(args)
    getattr(K, fn)(*with_np, **kw)
    with_torch = [torch.from_numpy(a) if isinstance(a, np.ndarray) else a for a in clone(args)]
    getattr(K, fn)(*with_torch, **kw)
    for i in outs:
        assert same(with_np[i], ref[i]), f"{fn}: output {i} (numpy) differs from the C call"
        assert same(with_torch[i].numpy(), ref[i]), f"{fn}: output {i} (torch) differs"
    for i, a in enumerate(args):  # inputs are only read
        if i not in outs and isinstance(a, np.ndarray):
            assert same(with_np[i], a) and same(with_torch[i].numpy(), a)


def test_every_kernel_has_a_case_and_a_docstring():
    tested = {spec_name.split("@")[0] for spec_name in CASES}
    special = {"TokRed", "linear_wgrad", "linear_wgrad_bound", "embedding_grad_bound",
               "embedding_grad_add", "wgrad_bound_exp", "use_fast_frameworks", "words",
               "GEMM_NN", "GEMM_NT", "GEMM_TN", "lr_at"} | {n for n in K.__all__ if n.endswith("_f32")}
    for name in K.__all__:
        assert name in tested or name in special, f"{name} has no bits test"
        obj = getattr(K, name)
        if callable(obj):
            assert obj.__doc__ and len(obj.__doc__) > 60, f"{name} has no docstring"


def test_gemm_bf16_and_string_layouts(lib):
    sys.path.insert(0, os.path.join(ROOT, "dev"))
    from bx_ctypes import dl_torch
    g = torch.Generator().manual_seed(3)
    a = torch.randn(5, 7, generator=g).bfloat16()
    b = torch.randn(4, 7, generator=g)
    ref, got, got2 = (torch.full((5, 4), 3.0) for _ in range(3))
    keep = []
    st = lib.bx_gemm(C.byref(dl_torch(a, keep)), C.byref(dl_torch(b, keep)), 0,
                     C.byref(dl_torch(ref, keep)), None)
    assert st == 0
    K.gemm(a, b, "nt", got)
    K.gemm(a, b, K.GEMM_NT, got2)
    assert torch.equal(got.view(torch.int32), ref.view(torch.int32))
    assert torch.equal(got2.view(torch.int32), ref.view(torch.int32))
    with pytest.raises(bitexact.InvalidArgumentError, match="layout 'xy'"):
        K.gemm(a, b, "xy", got)


def test_scalar_functions_and_bound_exp(lib):
    for name in ("exp", "log", "sigmoid", "silu", "rsqrt", "sin", "cos"):
        f = getattr(lib, f"bx_{name}_f32")
        f.restype, f.argtypes = C.c_float, [C.c_float]
        for x in (0.5, -3.25, 17.0, 1e-30):
            assert getattr(K, f"{name}_f32")(x) == f(x) or (np.isnan(f(x)))
    lib.bx_wgrad_bound_exp.restype = C.c_int
    lib.bx_wgrad_bound_exp.argtypes = [C.c_int64, C.c_float, C.c_float]
    for rows, a, b in ((1, 1.0, 1.0), (64, 3.5, 0.01), (0, 1.0, 1.0), (1000, 1e30, 1e10)):
        assert K.wgrad_bound_exp(rows, a, b) == lib.bx_wgrad_bound_exp(rows, a, b)


def test_in_place_where_allowed():
    x = torch.randn(4, 6)
    w = torch.randn(6)
    y = torch.empty(4, 6)
    K.rmsnorm_forward(x, w, 1e-6, y)
    x2 = x.clone()
    K.rmsnorm_forward(x2, w, 1e-6, x2)  # y may be x itself
    assert torch.equal(x2.view(torch.int32), y.view(torch.int32))
    with pytest.raises(bitexact.LayoutError) as e:  # any other overlap is refused
        K.exp(x[:, :5], x[:, 1:])
    assert e.value.argument in ("x", "y")


# ---- the token reduction state -------------------------------------------
def _tokred_data(T=6, N=3, Kd=4, V=5, H=2, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((T, N)).astype(np.float32),
            rng.standard_normal((T, Kd)).astype(np.float32),
            rng.integers(0, V, T).astype(np.int64), rng.standard_normal((T, H)).astype(np.float32))


def _emb_bwd(ids, dy, V, Cn):
    T = ids.shape[0]
    row_ids, rows = np.zeros(T, np.int64), np.zeros((T, dy.shape[1]), np.float32)
    offsets = np.zeros((T + Cn - 1) // Cn + 1, np.int64)
    K.embedding_backward(ids, dy, V, Cn, row_ids, rows, offsets)
    return row_ids, rows, offsets


def _binding_step(dy, x, ids, de, V, Cn, comm=None):
    T, N = dy.shape
    s = K.TokRed([(N, x.shape[1]), (N,), (V, de.shape[1])], Cn, T)
    K.linear_wgrad_bound(s, 0, 1, dy, x, 0)
    r_ids, rows, offs = _emb_bwd(ids, de, V, Cn)
    K.embedding_grad_bound(s, 2, rows, offs)
    s.agree(comm)
    K.linear_wgrad(s, 0, 1, dy, x, 0)
    K.embedding_grad_add(s, 2, 0, r_ids, rows, offs)
    words = K.words(s).copy()
    outs = [np.zeros((N, x.shape[1]), np.float32), np.zeros(N, np.float32),
            np.zeros((V, de.shape[1]), np.float64)]
    s.finish(outs, divisor=1)
    return words, outs, (r_ids, rows, offs)


def test_tokred_step_equals_c_library(lib):
    from dlpack_ctypes import DLTensor
    dy, x, ids, de = _tokred_data()
    V, Cn = 5, 2
    words, outs, (r_ids, rows, offs) = _binding_step(dy, x, ids, de, V, Cn)
    keep = []
    grads = (DLTensor * 3)(dl_np(np.zeros((3, 4), np.float32), keep),
                           dl_np(np.zeros(3, np.float32), keep),
                           dl_np(np.zeros((5, 2), np.float32), keep))
    s = C.c_void_p()
    NONE = C.c_size_t(2**64 - 1)
    d = lambda a: C.byref(dl_np(a, keep))  # noqa: E731
    assert lib.bx_tokred_create(grads, C.c_size_t(3), C.c_int64(Cn), C.c_int64(6), None,
                                C.byref(s)) == 0
    try:
        assert lib.bx_linear_wgrad_bound(s, C.c_size_t(0), C.c_size_t(1), d(dy), d(x),
                                         C.c_int64(0), None) == 0
        assert lib.bx_embedding_grad_bound(s, C.c_size_t(2), d(rows), d(offs)) == 0
        assert lib.bx_tokred_agree(s, None) == 0
        assert lib.bx_linear_wgrad(s, C.c_size_t(0), C.c_size_t(1), d(dy), d(x), C.c_int64(0),
                                   None) == 0
        assert lib.bx_embedding_grad_add(s, grads, C.c_size_t(3), C.c_size_t(2), C.c_int64(0),
                                         d(r_ids), d(rows), d(offs)) == 0
        wp, cnt = C.POINTER(C.c_int64)(), C.c_size_t()
        assert lib.bx_tokred_words(s, C.byref(wp), C.byref(cnt)) == 0
        ref_words = np.ctypeslib.as_array(wp, (cnt.value,)).copy()
        ref = [np.zeros((3, 4), np.float32), np.zeros(3, np.float32), np.zeros((5, 2), np.float64)]
        outs_c = (DLTensor * 3)(*[dl_np(a, keep) for a in ref])
        assert lib.bx_tokred_finish(s, outs_c, C.c_size_t(3), C.c_int64(1)) == 0
    finally:
        lib.bx_tokred_destroy(s)
    assert same(words, ref_words)
    for a, b in zip(outs, ref):
        assert same(a, b)
    assert np.any(outs[0] != 0)
    del NONE


def test_tokred_partials_fork_merge_and_chunks():
    rng = np.random.default_rng(5)
    T, H, Cn = 7, 4, 2
    parts = rng.standard_normal((4, H)).astype(np.float32)
    full = K.TokRed([torch.zeros(H)], Cn, T)  # a tensor: only its shape is read
    assert (full.ntensors, full.nchunks, full.chunk_tokens, full.total_tokens, full.mode) == \
        (1, 4, 2, 7, "grid")
    assert full.chunks(2, 6) == (1, 3) and full.chunks(6, 7) == (3, 4)
    with pytest.raises(bitexact.LayoutError):
        full.chunks(1, 4)  # not on a chunk boundary
    for c in range(4):
        full.bound(0, c, parts[c])
    full.agree()
    e = full.grid_exp(0)
    a, b = full.fork(), full.fork()
    for c in range(4):
        full.add(0, c, parts[c])
        (a if c < 2 else b).add(0, c, torch.from_numpy(parts[c]))
    a.merge(b)
    assert same(K.words(a), K.words(full)) and a.grid_exp(0) == e
    r1, r2 = np.zeros(H, np.float32), torch.zeros(H)
    full.finish([r1], divisor=T)
    a.finish([r2], divisor=T)
    assert same(r1, r2.numpy())
    with pytest.raises(bitexact.LayoutError):  # chunk 0 twice
        full.add(0, 0, parts[0])
        full.finish([r1])


def test_tokred_words_all_reduced_in_place():
    """Two 'ranks' in one process: each adds its chunks, the SUM of the
    words written back into one state's buffer (as an all-reduce would)
    gives the single-rank result."""
    rng = np.random.default_rng(9)
    parts = rng.standard_normal((4, 3, 2)).astype(np.float32)
    states = [K.TokRed([(3, 2)], 1, 4) for _ in range(3)]
    for s in states:
        s.bound_exp(0, 4)
        s.agree()
    for c in range(4):
        states[0].add(0, c, parts[c])
        states[1 if c < 2 else 2].add(0, c, parts[c])
    w1 = K.words(states[1], "torch")  # shares the state's memory
    w1 += K.words(states[2], "torch")
    assert same(K.words(states[1]), K.words(states[0]))
    outs = [np.zeros((3, 2), np.float32) for _ in range(2)]
    states[0].finish([outs[0]])
    states[1].finish([outs[1]])
    assert same(outs[0], outs[1])
    mv = states[0].words()
    assert mv.format == "q" and not mv.readonly and mv.nbytes == 8 * len(mv)


def test_tokred_comm_callable_and_its_failure():
    calls = []

    def comm(buf, op):
        calls.append(op)  # one rank: the all-reduce is the identity

    dy, x, ids, de = _tokred_data(seed=2)
    w0, o0, _ = _binding_step(dy, x, ids, de, 5, 2)
    w1, o1, _ = _binding_step(dy, x, ids, de, 5, 2, comm=comm)
    assert calls and set(calls) <= {"max", "sum"}
    assert same(w0, w1) and all(same(a, b) for a, b in zip(o0, o1))

    def bad(buf, op):
        raise OSError("link down")

    s = K.TokRed([(2,)], 1, 2)
    with pytest.raises(bitexact.CommError) as e:
        s.agree(bad)
    assert isinstance(e.value.__cause__, OSError)


def test_tokred_bad_input():
    with pytest.raises(bitexact.InvalidArgumentError, match="mode 'fast'"):
        K.TokRed([(2,)], 1, 2, mode="fast")
    with pytest.raises(bitexact.InvalidArgumentError, match="TokRed"):
        K.TokRed([(2,)], 0, 2)  # chunk_tokens < 1
    with pytest.raises(bitexact.DTypeError):
        K.TokRed([torch.zeros(2, dtype=torch.float64)], 1, 2)
    s = K.TokRed([(2,)], 1, 2)
    with pytest.raises(bitexact.InvalidArgumentError, match="not agreed"):
        K.words(s)
    s.bound_exp(0, 2)
    with pytest.raises(bitexact.InvalidArgumentError, match="argument 'state'"):
        K.linear_wgrad(object(), 0, None, np.zeros((2, 2), np.float32), None, 0)
    with pytest.raises(bitexact.InvalidArgumentError, match="'w_tensor' = -1"):
        K.linear_wgrad_bound(s, -1, None, np.zeros((2, 2), np.float32), None, 0)
    s.agree()
    with pytest.raises(bitexact.InvalidArgumentError, match="TokRed.add"):
        s.add(0, 5, np.zeros(2, np.float32))  # no chunk 5
    with pytest.raises(bitexact.InvalidArgumentError, match="TokRed.bound"):
        s.bound(0, 0, np.zeros(2, np.float32))  # after agree
    ro = np.zeros(2, np.float32)
    ro.flags.writeable = False
    s.add(0, 0, np.ones(2, np.float32))
    s.add(0, 1, np.ones(2, np.float32))
    with pytest.raises(bitexact.InvalidArgumentError, match=r"'outs\[0\]' is read-only"):
        s.finish([ro])
    with pytest.raises(bitexact.DTypeError, match=r"'outs\[0\]'.*not a tensor"):
        s.finish([[0.0, 0.0]])


# ---- bad input: the right exception, the argument named, nothing written --
def _rms(x=None, w=None, y=None, r=None):
    x = torch.randn(3, 4) if x is None else x
    w = torch.randn(4) if w is None else w
    y = torch.full((3, 4), 7.0) if y is None else y
    return x, w, y, (torch.full((3,), 7.0) if r is None else r)


def _raises(exc, argument, fn, *args, **kw):
    outs = [a for a in args if isinstance(a, (torch.Tensor, np.ndarray))]
    before = [copy.deepcopy(a) for a in outs]
    with pytest.raises(exc) as e:
        fn(*args, **kw)
    assert f"argument '{argument}'" in str(e.value), str(e.value)
    assert e.value.argument == argument
    for a, b in zip(outs, before):  # nothing written (inputs and outputs alike)
        assert same(np.asarray(a), np.asarray(b))
    return e.value


def test_bad_dtype_shape_layout_none_named():
    x, w, y, r = _rms()
    _raises(bitexact.DTypeError, "x", K.rmsnorm_forward, x.double(), w, 1e-5, y, r)
    _raises(bitexact.DTypeError, "y", K.rmsnorm_forward, x, w, 1e-5, y.half(), r)
    _raises(bitexact.InvalidArgumentError, "weight", K.rmsnorm_forward, x, w[:3], 1e-5, y, r)
    _raises(bitexact.InvalidArgumentError, "rstd", K.rmsnorm_forward, x, w, 1e-5, y, r[:2])
    xt = torch.randn(4, 3).t()  # non-contiguous
    _raises(bitexact.LayoutError, "x", K.rmsnorm_forward, xt, w, 1e-5, y, r)
    _raises(bitexact.LayoutError, "y", K.rmsnorm_forward, x, w, 1e-5,
            torch.full((4, 3), 7.0).t(), r)
    _raises(bitexact.InvalidArgumentError, "y", K.rmsnorm_forward, x, w, 1e-5, None, r)
    _raises(bitexact.DTypeError, "weight", K.rmsnorm_forward, x, [1.0] * 4, 1e-5, y, r)
    # kernels of the other files, and a location the library gives by argument order
    ids = np.zeros((3, 2), np.int64)
    _raises(bitexact.InvalidArgumentError, "counts", K.moe_router_forward,
            np.zeros((3, 4), np.float32), np.zeros(4, np.float32), ids,
            np.zeros((3, 2), np.float32), 2, np.zeros((5, 4), np.int64))
    _raises(bitexact.DTypeError, "targets", K.xent_forward, np.zeros((3, 4), np.float32),
            np.zeros(3, np.float32), 1, np.zeros(3, np.float32))
    _raises(bitexact.InvalidArgumentError, "b", K.gemm, torch.randn(2, 3), torch.randn(3),
            "nt", torch.zeros(2, 2))
    _raises(bitexact.LayoutError, "bounds", K.moe_expert_chunks, np.arange(4, dtype=np.int64),
            2, 0, np.zeros((6, 2), np.int64)[:, 0])
    # a value the library refuses: a target out of range, nothing written
    e = _raises(bitexact.InvalidArgumentError, "targets", K.xent_forward,
                np.zeros((3, 4), np.float32), np.array([0, 9, 1]), 1, np.full(3, 5.0, np.float32))
    assert "token 1" in str(e)


def test_read_only_or_copied_outputs_refused():
    x, w, y, r = _rms()
    ro = np.full((3, 4), 7.0, np.float32)
    ro.flags.writeable = False
    e = _raises(bitexact.InvalidArgumentError, "y", K.rmsnorm_forward, x, w, 1e-5, ro, r)
    assert "read-only" in str(e)
    xr = x.numpy().copy()
    xr.flags.writeable = False  # a read-only INPUT is fine
    K.rmsnorm_forward(xr, w, 1e-5, y, r)
    for flags, what in ((1, "read-only"), (2, "copy")):
        p = Producer(torch.full((3,), 7.0), versioned=True, flags=flags)
        e = _raises(bitexact.InvalidArgumentError, "rstd", K.rmsnorm_forward, x, w, 1e-5, y, p)
        assert what in str(e) and p.deleted == 1  # its capsule released all the same


def test_device_refused_and_capsules_released_once():
    x, w, y, r = _rms()
    p = Producer(torch.full((3, 4), 7.0), device_type=KDLCUDA)
    _raises(bitexact.DeviceError, "y", K.rmsnorm_forward, x, w, 1e-5, p, r)
    assert p.deleted == 1
    ps = [Producer(t) for t in (x, w, y, r)]
    K.rmsnorm_forward(*ps[:2], 1e-5, *ps[2:])
    assert [q.deleted for q in ps] == [1, 1, 1, 1]
    ps = [Producer(t) for t in (x, w[:2], y, r)]  # a failing call releases every capsule too
    with pytest.raises(bitexact.InvalidArgumentError):
        K.rmsnorm_forward(*ps[:2], 1e-5, *ps[2:])
    assert [q.deleted for q in ps] == [1, 1, 1, 1]
    cap = y.__dlpack__()  # a capsule is consumed once
    K.rmsnorm_forward(x, w, 1e-5, cap, r)
    with pytest.raises(bitexact.InvalidArgumentError, match="argument 'y'.*consumed only once"):
        K.rmsnorm_forward(x, w, 1e-5, cap, r)


class _ViaDunder:
    """An object exporting a torch tensor through Tensor.__dlpack__ (the path
    of producers without bitexact's fast exporter)."""

    def __init__(self, t):
        self.t = t

    def __dlpack__(self, **kw):
        return self.t.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.t.__dlpack_device__()


def test_requires_grad_through_dunder_dlpack_says_detach():
    x, w, y, r = _rms()
    xg = x.clone().requires_grad_()
    e = _raises(bitexact.InvalidArgumentError, "x", K.rmsnorm_forward, _ViaDunder(xg), w, 1e-5,
                y, r)
    assert "detach()" in str(e) and isinstance(e.__cause__, BufferError)
    K.rmsnorm_forward(_ViaDunder(xg.detach()), w, 1e-5, y, r)  # what the message says works
    y2 = torch.empty_like(y)
    K.rmsnorm_forward(xg, w, 1e-5, y2, r)  # torch's C exporter takes it as it is
    assert torch.equal(y2.view(torch.int32), y.view(torch.int32))


def test_python_signature_and_options():
    x, w, y, r = _rms()
    K.rmsnorm_forward(x=x, weight=w, eps=1e-5, y=y, rstd=r, num_threads=1)
    with pytest.raises(TypeError):
        K.rmsnorm_forward(x, w, 1e-5, y, r, 1)  # num_threads is keyword-only
    with pytest.raises(bitexact.InvalidArgumentError, match="num_threads"):
        K.rmsnorm_forward(x, w, 1e-5, y, r, num_threads=-1)


# ---- threads, references, memory -----------------------------------------
def test_gil_released_during_the_kernel():
    n = 256
    while True:  # a GEMM of at least 50 ms on this machine
        a, b, c = torch.randn(n, n), torch.randn(n, n), torch.empty(n, n)
        t0 = time.perf_counter()
        K.gemm(a, b, "nt", c, num_threads=1)
        if time.perf_counter() - t0 >= 0.05 or n >= 2048:
            break
        n *= 2
    span = {}

    def work():
        span["t0"] = time.perf_counter()
        K.gemm(a, b, "nt", c, num_threads=1)
        span["t1"] = time.perf_counter()

    th = threading.Thread(target=work)
    stamps = []
    th.start()
    while th.is_alive():
        stamps.append(time.perf_counter())
    th.join()
    inside = [s for s in stamps if span["t0"] + 0.005 < s < span["t1"] - 0.005]
    assert span["t1"] - span["t0"] > 0.02
    assert len(inside) > 100, "the main thread did not run while the kernel ran"


def test_tokred_refuses_a_concurrent_call():
    s = K.TokRed([(1 << 16,)], 1, 1)
    s.bound_exp(0, 3)
    s.agree()
    gate = threading.Event()
    errors = []

    def slow(buf, op):
        gate.wait(5)  # holds the state busy inside allreduce

    th = threading.Thread(target=lambda: s.allreduce(slow))
    th.start()
    time.sleep(0.05)
    try:
        s.add(0, 0, np.zeros(1 << 16, np.float32))
    except bitexact.InvalidArgumentError as e:
        errors.append(str(e))
    gate.set()
    th.join()
    assert errors and "in use by another thread" in errors[0]


def test_no_reference_or_memory_leak():
    x, w, y, r = _rms()
    xn, wn, yn = x.numpy(), w.numpy(), y.numpy().copy()
    bad = w[:2]
    refs = [sys.getrefcount(o) for o in (x, w, y, r, xn, wn, yn, bad)]

    def loop(n):
        for _ in range(n):
            K.rmsnorm_forward(x, w, 1e-5, y, r)
            K.rmsnorm_forward(xn, wn, 1e-5, yn)
            try:
                K.rmsnorm_forward(x, bad, 1e-5, y)
            except bitexact.InvalidArgumentError:
                pass
            s = K.TokRed([(4,)], 1, 1)
            s.bound_exp(0, 1)
            s.agree()
            K.words(s)
    loop(200)
    gc.collect()
    tracemalloc.start()
    m0 = tracemalloc.get_traced_memory()[0]
    loop(10000)
    gc.collect()
    grown = tracemalloc.get_traced_memory()[0] - m0
    tracemalloc.stop()
    assert [sys.getrefcount(o) for o in (x, w, y, r, xn, wn, yn, bad)] == refs
    assert grown < 64 * 1024, f"{grown} bytes kept over 10000 iterations"


def test_paddle_tensors_same_bits():
    """Paddle tensors through bitexact's exporter (use_fast_frameworks once
    paddle is imported): the bits of the numpy call, the output written in
    the Paddle tensor's own memory."""
    paddle = pytest.importorskip("paddle", reason="paddlepaddle is not installed")
    K.use_fast_frameworks()
    rng = np.random.default_rng(4)
    x, w = rng.standard_normal((5, 6)).astype(np.float32), rng.standard_normal(6).astype(np.float32)
    yn = np.zeros((5, 6), np.float32)
    K.rmsnorm_forward(x, w, 1e-5, yn)
    px, pw, py = paddle.to_tensor(x), paddle.to_tensor(w), paddle.zeros([5, 6], "float32")
    pw.stop_gradient = False  # Tensor.__dlpack__ would refuse it; the exporter does not
    K.rmsnorm_forward(px, pw, 1e-5, py)
    assert same(py.numpy(), yn)
    with pytest.raises(bitexact.DTypeError) as e:
        K.rmsnorm_forward(px.astype("float64"), pw, 1e-5, py)
    assert e.value.argument == "x" and same(py.numpy(), yn)


def test_lr_at_equals_the_c_call(lib):
    """lr_at (a scalar: no tensor case above) against bx_lr_at through
    ctypes, bit for bit, over the schedules, warmups, min_lr and steps."""
    f = lib.bx_lr_at
    f.restype = C.c_int
    f.argtypes = [C.c_int, C.c_double, C.c_double, C.c_int64, C.c_int64, C.c_int64,
                  C.POINTER(C.c_double)]
    names = ["constant", "linear", "cosine", "constant_with_warmup"]
    n = 0
    for k, name in enumerate(names):
        for W, N, m in ((0, 10, 0.0), (3, 17, 0.0), (5, 40, 1e-4 if k in (1, 2) else 0.0)):
            for s in range(N + 3):
                out = C.c_double(-1)
                assert f(k, 3e-4 if m == 0 else 1e-3, m, W, N, s, C.byref(out)) == 0
                got = K.lr_at(name, 3e-4 if m == 0 else 1e-3, s, total_steps=N, warmup_steps=W,
                              min_lr=m)
                assert got.hex() == out.value.hex(), (name, W, N, m, s)
                n += 1
    assert n > 200
