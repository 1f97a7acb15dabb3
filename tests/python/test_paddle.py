"""bitexact.paddle.ClipGradByGlobalNorm against real Paddle (CPU build).

Paddle's CPU kernels: squared_l2_norm exists for fp32/fp64 only (Paddle's
class casts fp16/bf16 gradients to fp32 first when its "mp type" flag is
set, which the fixture `paddle_mp` does, as AMP training would), and
multiply has no fp16 kernel: Paddle's own class cannot clip fp16 gradients
on CPU, so fp16 results are checked against the product computed
independently (numpy) with Paddle's own coefficient.
"""
import math
import os
import re
import subprocess
import sys
from fractions import Fraction

import numpy as np
import pytest

try:
    import paddle
except ImportError as e:  # the only reason to skip: Paddle absent
    pytest.skip(f"paddle is not importable ({e}); scripts/py_setup.sh installs the pinned "
                "paddlepaddle", allow_module_level=True)

import paddle.nn.clip as pclip
import torch

import bitexact
import bitexact.paddle as bp
import bitexact.torch as bt
from exact_ref import exact_norm, round_fraction
from helpers import random_tensors

INT = {"float64": np.int64, "float32": np.int32, "float16": np.int16}


def dname(t):
    return str(t.dtype).split(".")[-1]


def pbits(t):
    """Bit pattern of a Paddle tensor as a numpy integer array (bf16's
    .numpy() already gives its uint16 bits)."""
    a = t.numpy()
    return a.view(INT[dname(t)]) if dname(t) in INT else a  # bf16, integers: as they are


def same(a, b):
    return a.dtype == b.dtype and list(a.shape) == list(b.shape) and np.array_equal(pbits(a),
                                                                                      pbits(b))


def to_paddle(t):
    """A torch tensor's values as a Paddle tensor, through numpy (bf16 via
    its exact fp32 widening, cast back by Paddle: exact); bits checked."""
    name = str(t.dtype).split(".")[-1]
    if name == "bfloat16":
        p = paddle.to_tensor(t.float().numpy()).astype("bfloat16")
        assert np.array_equal(p.numpy(), t.view(torch.int16).numpy().view(np.uint16))
    else:
        p = paddle.to_tensor(t.numpy())
        assert np.array_equal(pbits(p), t.numpy().view(INT[name]))
    return p


def param(shape, dtype="float32", name=None, need_clip=True):
    return paddle.create_parameter(
        shape, dtype, name=name, attr=paddle.ParamAttr(need_clip=need_clip),
        default_initializer=paddle.nn.initializer.Constant(0.0))


def params_grads(values, need_clip=None):
    """Parameters with the given gradients, set through a real backward
    (grad = d(sum(p * v))/dp = v), so they are Paddle's own gradient
    tensors (stop_gradient=False)."""
    out = []
    for k, v in enumerate(values):
        p = param(v.shape, dname(v), need_clip=True if need_clip is None else need_clip[k])
        # in fp64 (Paddle's CPU build has no fp16 multiply); the gradient
        # v64 cast back to p's dtype is v exactly
        (p.astype("float64") * v.astype("float64")).sum().backward()
        assert p.grad is not None and same(p.grad, v)
        out.append((p, p.grad))
    return out


@pytest.fixture
def paddle_mp():
    """Paddle's class casts fp16/bf16 to fp32 for its norm (its CPU build
    has no fp16/bf16 squared_l2_norm kernel)."""
    old = pclip._clip_by_global_norm_using_mp_type(True)
    yield
    pclip._clip_by_global_norm_using_mp_type(old)


def paddle_norm(grads):
    """Paddle's global norm, by the ops of ClipGradByGlobalNorm._dygraph_clip
    (per-tensor squared norms, summed per dtype class in list order, then
    across classes, sqrt) in its dtype."""
    lo, f32, f64 = [], [], []
    for g in grads:
        s = pclip._squared_l2_norm(g)
        (lo if dname(s) in ("float16", "bfloat16") else f32 if dname(s) == "float32"
         else f64).append(s)
    dt = "float64" if f64 else "float32"
    parts = [paddle.stack(x).sum().astype(dt) for x in (lo, f32, f64) if x]
    return paddle.sqrt(paddle.stack(parts).sum())


def dyadic(seed, dtypes, n=40):
    """Gradients k/16, |k| <= 64: every square and every partial sum is exact
    in fp32, so Paddle's norm is the correctly rounded one (bitexact's)."""
    rng = np.random.default_rng(seed)
    return [paddle.to_tensor((rng.integers(-64, 65, size=(n + 7 * j,)) / 16.0)
                             .astype(np.float32)).astype(dt) for j, dt in enumerate(dtypes)]


# ---- environment ----------------------------------------------------------

@pytest.mark.parametrize("first", ["paddle", "torch"])
def test_paddle_and_torch_in_one_process(first):
    """Both frameworks import and run (backward, matmul) in one process, in
    either order."""
    second = "torch" if first == "paddle" else "paddle"
    code = (f"import {first}, {second}, numpy\n"
            "x = paddle.randn([8, 8]); x.stop_gradient = False\n"
            "paddle.matmul(x, x).sum().backward(); assert x.grad is not None\n"
            "y = torch.randn(8, 8, requires_grad=True); (y @ y).sum().backward()\n"
            "assert y.grad is not None\n"
            "print(paddle.__version__, torch.__version__, numpy.__version__)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=300, env=dict(os.environ))
    assert r.returncode == 0, r.stderr[-2000:]


def test_export_shares_memory_and_writes_the_gradient():
    """Gradients (stop_gradient=False) refuse __dlpack__; the binding's
    export is the gradient's own memory, and scaling writes it."""
    (p, g), = params_grads([paddle.to_tensor([3.0, 4.0])])
    assert not g.stop_gradient
    with pytest.raises(BufferError):
        g.__dlpack__()
    assert torch.from_dlpack(bitexact._frameworks.paddle_export(g)).data_ptr() == g.data_ptr()
    ptr, ver = g.data_ptr(), g.inplace_version
    out = bp.ClipGradByGlobalNorm(1.0)([(p, g)])
    assert out[0][1] is g and p.grad.data_ptr() == ptr and g.inplace_version > ver
    assert p.grad.numpy().tolist() == [np.float32(3.0) * np.float32(0.2),
                                       np.float32(4.0) * np.float32(0.2)]


def test_neutral_api_takes_paddle_tensors():
    """bitexact.total_norm / clip_grad_norm on Paddle gradients and views."""
    (_, g1), (_, g2) = params_grads([paddle.to_tensor([3.0]), paddle.to_tensor([[4.0, 12.0]])])
    assert bitexact.total_norm([g1, g2]) == 13.0
    a = paddle.arange(12, dtype="float32").reshape([3, 4])
    v = a[1:]  # a view at an offset into a's memory: rows 1 and 2
    assert v.data_ptr() == a.data_ptr() + 16
    assert bitexact.total_norm(v) == exact_norm([np.arange(4.0, 12.0)])
    bitexact.scale([v], 0.5)
    assert a.numpy().tolist() == [[0, 1, 2, 3], [2, 2.5, 3, 3.5], [4, 4.5, 5, 5.5]]
    # bitexact.clip_grad_norm on parameters' gradients, in place
    (_, g3), = params_grads([paddle.to_tensor([6.0, 8.0])])
    assert bitexact.clip_grad_norm([g3], 5.0, formula="max", scale_mode="exact") == 10.0
    assert g3.numpy().tolist() == [3.0, 4.0]


def test_neutral_api_without_bitexact_paddle():
    """In a process that never imports bitexact.paddle (paddle imported
    after bitexact): total_norm takes parameters and their gradients
    (stop_gradient=False) directly."""
    code = ("import bitexact, sys\n"
            "import paddle\n"
            "p = paddle.create_parameter([2], 'float32', default_initializer="
            "paddle.nn.initializer.Assign([3.0, 4.0]))\n"
            "(p * p).sum().backward()\n"
            "assert not p.stop_gradient and not p.grad.stop_gradient\n"
            "assert 'bitexact.paddle' not in sys.modules\n"
            "assert bitexact.total_norm(p) == 5.0 and bitexact.total_norm([p.grad]) == 10.0\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=300, env=dict(os.environ))
    assert r.returncode == 0, r.stderr[-2000:]


# ---- norms: bitexact.torch's bits, order independence --------------------

MIXES = [["float32"], ["bfloat16"], ["float16"], ["float32", "bfloat16"],
         ["float16", "bfloat16"], ["float32", "float16", "bfloat16"]]


@pytest.mark.parametrize("mix", MIXES, ids="+".join)
@pytest.mark.parametrize("seed", [0, 1])
def test_norm_bits_equal_bitexact_torch(mix, seed):
    tg = random_tensors(seed, mix, count=8)
    pg = params_grads([to_paddle(t) for t in tg])
    clip = bp.ClipGradByGlobalNorm(1e30)
    clip(pg)
    ours = clip.last_global_norm
    assert dname(ours) == "float32" and list(ours.shape) == []
    tn = bt.get_total_norm(tg)  # torch's dtype: fp32, or bf16/fp16 when all are
    if tn.dtype == torch.float32:
        assert pbits(ours).tolist() == tn.view(torch.int32).item()
    else:  # bf16/fp16 values widen exactly (and injectively) to float
        nd = str(tn.dtype).split(".")[-1]
        mine = bitexact.total_norm([g for _, g in pg], norm_dtype=nd)
        assert mine == tn.float().item() and not math.isnan(mine)
        assert bitexact.total_norm(tg, norm_dtype="float32") == float(ours)
    assert float(ours) == exact_norm(tg, "float32")


def test_paddle_norm_depends_on_order_bitexact_does_not(paddle_mp):
    """[1], [2^-12] x 3 (fp32): Paddle sums the squares in list order, so
    1 + 2^-24 + 2^-24 + 2^-24 stays 1 while 3*2^-24 + 1 rounds up; its
    norm (and the clipped gradients) change with the parameter order."""
    vals = [[1.0], [2.0 ** -12], [2.0 ** -12], [2.0 ** -12]]

    def run(order):
        grads = [paddle.to_tensor(vals[k], dtype="float32") for k in order]
        theirs_norm = paddle_norm(grads)
        theirs = params_grads(grads)
        out = paddle.nn.ClipGradByGlobalNorm(0.5)(theirs)
        ours = params_grads(grads)
        clip = bp.ClipGradByGlobalNorm(0.5)
        mine = clip(ours)
        pos = order.index(0)  # where the [1.0] gradient is
        return (pbits(theirs_norm).item(), pbits(out[pos][1]).item(),
                pbits(clip.last_global_norm).item(), pbits(mine[pos][1]).item())

    a, b = run([0, 1, 2, 3]), run([1, 2, 3, 0])
    assert a[0] != b[0] and a[1] != b[1]  # Paddle: different norm, different grads
    assert a[2] == b[2] and a[3] == b[3]  # bitexact: the same bits
    assert np.array([a[2]], np.int32).view(np.float32)[0] == exact_norm(
        [np.array(v) for v in vals], "float32")


def test_norm_independent_of_order_random():
    tg = random_tensors(5, ["float32", "bfloat16", "float16"], count=9)
    grads = [to_paddle(t) for t in tg]
    seen = set()
    rng = np.random.default_rng(6)
    for perm in [range(9)] + [rng.permutation(9).tolist() for _ in range(8)]:
        clip = bp.ClipGradByGlobalNorm(1e30)
        clip(params_grads([grads[k] for k in perm]))
        seen.add(pbits(clip.last_global_norm).item())
    assert len(seen) == 1


# ---- clipped gradients: Paddle's bits ------------------------------------

CASES = [["float32"], ["bfloat16"], ["float64"], ["float32", "bfloat16"],
         ["float64", "float32", "bfloat16"]]


@pytest.mark.parametrize("auto_skip", [False, True])
@pytest.mark.parametrize("dtypes", CASES, ids="+".join)
def test_clip_equals_paddle_when_norms_agree(dtypes, auto_skip, paddle_mp):
    grads = dyadic(3, dtypes)
    theirs, ours = params_grads(grads), params_grads(grads)
    clip = bp.ClipGradByGlobalNorm(2.5, auto_skip_clip=auto_skip)
    mine = clip(ours)
    out = paddle.nn.ClipGradByGlobalNorm(2.5, auto_skip_clip=auto_skip)(theirs)
    assert same(clip.last_global_norm, paddle_norm(grads))  # the norms agree
    assert float(clip.last_global_norm) > 2.5  # clipping is active
    assert len(mine) == len(out)
    for (p1, g1), (p2, g2), g0 in zip(mine, out, grads):
        assert same(g1, g2), f"{dname(g0)} gradient differs from Paddle's"
        assert not same(g1, g0)


def test_fp16_paddle_cpu_cannot_clip_ours_is_its_formula(paddle_mp):
    """Paddle's CPU build has no fp16 multiply: its class raises. Ours: each
    element g * c16 rounded once, c16 = Paddle's coefficient cast to fp16."""
    grads = dyadic(4, ["float16", "float16"])
    with pytest.raises(RuntimeError, match="float16"):
        paddle.nn.ClipGradByGlobalNorm(2.5)(params_grads(grads))
    clip = bp.ClipGradByGlobalNorm(2.5)
    mine = clip(params_grads(grads))
    assert same(clip.last_global_norm, paddle_norm(grads))
    m = paddle.full([1], 2.5, "float32")
    c16 = paddle.divide(m, paddle.maximum(clip.last_global_norm, m)).astype("float16")
    c = np.float32(c16.numpy()[0])
    for (_, g), g0 in zip(mine, grads):
        ref = (g0.numpy().astype(np.float32) * c).astype(np.float16)
        assert np.array_equal(pbits(g), ref.view(np.int16))


@pytest.mark.parametrize("dtypes", CASES + [["float16", "float32"]], ids="+".join)
def test_coefficient_path_with_the_same_norm(dtypes):
    """Any gradients (norms need not agree): Paddle's own ops fed bitexact's
    norm give bitexact's clipped gradients bit for bit."""
    tg = random_tensors(9, dtypes, count=2 * len(dtypes))
    grads = [to_paddle(t) for t in tg]
    clip = bp.ClipGradByGlobalNorm(0.75)
    mine = clip(params_grads(grads))
    gn = clip.last_global_norm
    assert dname(gn) == ("float64" if "float64" in dtypes else "float32")
    assert float(gn) == exact_norm(tg, dname(gn)) > 0.75
    m = paddle.full([1], 0.75, dname(gn))
    clip_var = paddle.divide(m, paddle.maximum(gn, m))
    for (_, g), g0 in zip(mine, grads):
        c = clip_var.astype(g0.dtype) if clip_var.dtype != g0.dtype else clip_var
        if dname(g0) == "float16":  # no Paddle CPU kernel: the product rounded once
            ref = paddle.to_tensor((g0.numpy().astype(np.float32)
                                    * np.float32(c.numpy()[0])).astype(np.float16))
        else:
            ref = paddle.multiply(g0, c)
        assert same(g, ref)


def test_adamw_step_equals_paddle(paddle_mp):
    """A real AdamW step on a tiny model with grad_clip=bitexact's class
    gives Paddle's parameters bit for bit (dyadic weights and inputs: the
    gradients and their squares are exact, so the norms agree)."""
    def model():
        paddle.seed(0)
        m = paddle.nn.Sequential(paddle.nn.Linear(4, 3), paddle.nn.ReLU(),
                                 paddle.nn.Linear(3, 2))
        rng = np.random.default_rng(1)
        for p in m.parameters():
            p.set_value((rng.integers(-8, 9, size=p.shape) / 8.0).astype(np.float32))
        return m
    x = paddle.to_tensor((np.random.default_rng(2).integers(-8, 9, size=(8, 4)) / 4.0)
                         .astype(np.float32))
    results, norms = [], []
    for clip in (paddle.nn.ClipGradByGlobalNorm(0.5), bp.ClipGradByGlobalNorm(0.5)):
        m = model()
        opt = paddle.optimizer.AdamW(learning_rate=0.1, parameters=m.parameters(),
                                     grad_clip=clip, weight_decay=0.01)
        m(x).sum().backward()
        norms.append(paddle_norm([p.grad for p in m.parameters()]))
        opt.step()
        results.append([p.clone() for p in m.parameters()])
    assert float(norms[0]) > 0.5  # clipping active
    assert same(clip.last_global_norm, norms[0])
    for a, b in zip(*results):
        assert same(a, b)


# ---- formula="exact" vs the integer reference -----------------------------

def _signed(r, x, coef):
    """r with the sign of x * coef (zeros included)."""
    return math.copysign(r, math.copysign(1.0, x) * math.copysign(1.0, coef))


def _exact_product(x, coef, fmt):
    return _signed(round_fraction(abs(Fraction(x) * Fraction(coef)), fmt), x, coef)


@pytest.mark.parametrize("mode", ["exact", "torch"])
def test_exact_formula_vs_reference(mode):
    tg = random_tensors(11, ["float32", "bfloat16", "float16", "float64"], count=4,
                        max_numel=200)
    grads = [to_paddle(t) for t in tg]
    norm = exact_norm(tg, "float64")
    clip_norm = norm / 3.0
    clip = bp.ClipGradByGlobalNorm(clip_norm, formula="exact", scale_mode=mode)
    mine = clip(params_grads(grads))
    assert dname(clip.last_global_norm) == "float64" and float(clip.last_global_norm) == norm
    coef = float(Fraction(clip_norm) / Fraction(norm))  # correctly rounded fp64 quotient
    for (_, g), t in zip(mine, tg):
        fmt = str(t.dtype).split(".")[-1]
        x = t.double().numpy().ravel()
        if mode == "exact" or fmt == "float64":
            ref = [_exact_product(float(v), coef, fmt) for v in x]
        else:  # fp32 coefficient, fp32 product, rounded to the dtype
            ref = [_signed(round_fraction(abs(Fraction(float(np.float32(v) * np.float32(coef)))),
                                          fmt), float(v), coef) for v in x]
        # bf16/fp16/fp32 widen exactly to fp64: compare the fp64 bit patterns
        got = g.astype("float64").numpy().ravel() if fmt != "float64" else g.numpy().ravel()
        assert np.array_equal(got.view(np.int64), np.array(ref, np.float64).view(np.int64)), fmt
    # below the threshold nothing changes (coefficient exactly 1)
    pg = params_grads(grads)
    bp.ClipGradByGlobalNorm(norm * 2, formula="exact")(pg)
    assert all(same(g, g0) for (_, g), g0 in zip(pg, grads))


# ---- need_clip, None grads, 0-D, return value -----------------------------

def test_need_clip_none_and_zero_dim_like_paddle():
    vals = [paddle.to_tensor([3.0, 4.0]), paddle.to_tensor([100.0]), paddle.to_tensor(12.0)]

    def build():
        pg = params_grads(vals, need_clip=[True, False, True])
        extra = param([2])  # no gradient
        return [pg[0], (extra, None), pg[1], pg[2]]
    ours, theirs = build(), build()
    clip = bp.ClipGradByGlobalNorm(6.5)
    mine = clip(ours)
    out = paddle.nn.ClipGradByGlobalNorm(6.5)(theirs)
    assert float(clip.last_global_norm) == 13.0  # sqrt(9 + 16 + 144): need_clip=False excluded
    assert [p.name for p, _ in mine] == [ours[k][0].name for k in (0, 2, 3)]
    assert [p.name for p, _ in out] == [theirs[k][0].name for k in (0, 2, 3)]
    for (_, a), (_, b) in zip(mine, out):
        assert same(a, b)
    assert mine[0][1] is ours[0][1]  # in place
    assert mine[1][1] is ours[2][1] and same(mine[1][1], vals[1])  # need_clip=False: untouched
    # 0-D: a new tensor of shape [1] (Paddle's g * coef), the parameter's
    # gradient unchanged
    assert mine[2][1] is not ours[3][1] and same(ours[3][1], vals[2])
    assert list(mine[2][1].shape) == [1] and mine[2][1].numpy().tolist() == [6.0]
    # nothing counted: Paddle returns its input as is
    pg = [(ours[1][0], None), ours[2]]
    assert bp.ClipGradByGlobalNorm(1.0)(pg) is pg


# ---- errors and non-finite values ------------------------------------------

def _snapshot(pg):
    return [None if g is None else g.clone() for _, g in pg]


def _unchanged(pg, snap):
    return all(same(g, s) for (_, g), s in zip(pg, snap) if g is not None)


def test_integer_gradient_named_nothing_changed():
    pg = params_grads([paddle.to_tensor([3.0, 4.0])])
    p = param([2], name="int_param")
    pg.append((p, paddle.to_tensor([1, 2], dtype="int32")))
    snap = _snapshot(pg)
    with pytest.raises(bitexact.DTypeError,
                       match=re.escape(f"parameter '{p.name}' (params_grads[1])")):
        bp.ClipGradByGlobalNorm(1.0)(pg)
    assert _unchanged(pg, snap)


@pytest.mark.parametrize("formula", ["paddle", "exact"])
def test_nonfinite(formula, paddle_mp):
    base = [paddle.to_tensor([3.0, 4.0]), paddle.to_tensor([1.0, float("nan")])]
    pg = params_grads(base)
    snap = _snapshot(pg)
    with pytest.raises(bitexact.NonFiniteError, match=pg[1][0].name):
        bp.ClipGradByGlobalNorm(1.0, formula=formula, error_if_nonfinite=True)(pg)
    assert _unchanged(pg, snap)
    # without error_if_nonfinite: NaN norm, NaN gradients, as Paddle's
    mine = bp.ClipGradByGlobalNorm(1.0, formula=formula)(pg)
    assert all(np.isnan(g.numpy()).all() for _, g in mine)
    # Inf norm: coefficient 0 (Inf * 0 = NaN), Paddle's bits for formula="paddle"
    infs = [paddle.to_tensor([3.0, -4.0]), paddle.to_tensor([float("inf"), 2.0])]
    mine = bp.ClipGradByGlobalNorm(1.0, formula=formula)(params_grads(infs))
    out = paddle.nn.ClipGradByGlobalNorm(1.0)(params_grads(infs))
    for (_, a), (_, b) in zip(mine, out):
        assert np.array_equal(np.isnan(a.numpy()), np.isnan(b.numpy()))
        assert np.array_equal(np.nan_to_num(a.numpy()), np.nan_to_num(b.numpy()))
        if formula == "paddle":  # Paddle's bits, but a NaN is the canonical one
            # (docs/design.md "NaN"; Paddle's is the CPU's default NaN: negative on x86-64)
            ua, ub = a.numpy().view(np.uint32), b.numpy().view(np.uint32)
            nan = np.isnan(a.numpy())
            assert np.array_equal(ua[~nan], ub[~nan])
            assert (ua[nan] == 0x7FC00000).all()


def test_shared_memory_refused_nothing_changed():
    pg = params_grads([paddle.to_tensor([3.0, 4.0])])
    pg.append((param([2], name="alias"), pg[0][1]))
    snap = _snapshot(pg)
    with pytest.raises(bitexact.LayoutError, match="alias"):
        bp.ClipGradByGlobalNorm(1.0)(pg)
    assert _unchanged(pg, snap)


def test_bad_arguments():
    with pytest.raises(bitexact.InvalidArgumentError, match="clip_norm"):
        bp.ClipGradByGlobalNorm(-1.0)
    with pytest.raises(ValueError, match="clip_norm"):
        bp.ClipGradByGlobalNorm(math.nan)
    with pytest.raises(bitexact.InvalidArgumentError, match="formula"):
        bp.ClipGradByGlobalNorm(1.0, formula="torch")
    with pytest.raises(bitexact.InvalidArgumentError, match="scale_mode"):
        bp.ClipGradByGlobalNorm(1.0, scale_mode="exact")
    with pytest.raises(bitexact.InvalidArgumentError, match="scale_mode"):
        bp.ClipGradByGlobalNorm(1.0, formula="exact", scale_mode="bogus")
    with pytest.raises(bitexact.InvalidArgumentError, match="auto_skip_clip"):
        bp.ClipGradByGlobalNorm(1.0, auto_skip_clip=1)
    clip = bp.ClipGradByGlobalNorm(1.0)
    with pytest.raises(bitexact.InvalidArgumentError, match="dynamic graph"):
        clip._static_clip([])
    pg = params_grads([paddle.to_tensor([3.0, 4.0])])
    snap = _snapshot(pg)
    clip.should_comm_on_shard_dim = True  # what Paddle's sharded optimizers set
    with pytest.raises(bitexact.InvalidArgumentError, match="distributed"):
        clip(pg)
    assert _unchanged(pg, snap)
    assert isinstance(clip, paddle.nn.clip.GradientClipBase)
    assert "bitexact" in str(clip)
