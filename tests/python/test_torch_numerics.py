"""bitexact.torch against the exact integer reference and against torch."""
import math

import pytest
import torch

import bitexact
import bitexact.torch as bt
from exact_ref import exact_megatron, exact_norm
from helpers import FMT, params_with_grads, random_tensors, same_bits

MIXES = [
    ["float32"], ["bfloat16"], ["float16"], ["float64"],
    ["float32", "bfloat16"], ["float16", "bfloat16"],
    ["float32", "float16", "bfloat16"], ["float64", "float32", "bfloat16"],
]
SEEDS = [0, 1, 2]


PRECISION = {torch.float64: 53, torch.float32: 24, torch.bfloat16: 8, torch.float16: 11}


def torch_tolerance(*dtypes):
    """torch rounds each per-tensor norm to its grad's dtype and combines
    them in floating point: a few units of 2^-p for the narrowest dtype
    involved, plus the fp32 summation error of a few thousand terms."""
    p = min(PRECISION[d] for d in dtypes)
    return 4 * 2.0 ** -p + 1e-6


@pytest.mark.parametrize("mix", MIXES, ids=lambda m: "+".join(m))
@pytest.mark.parametrize("seed", SEEDS)
def test_norm_exact_and_close_to_torch(mix, seed):
    grads = random_tensors(seed, mix)
    ours = bt.get_total_norm(grads)
    theirs = torch.nn.utils.get_total_norm(grads)
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape == ()
    assert ours.device == theirs.device
    ref = exact_norm(grads, FMT[ours.dtype])
    assert float(ours) == ref, f"seed {seed}: {float(ours)!r} != exact {ref!r}"
    # the fp64 norm of the neutral API is the correctly rounded fp64 norm
    assert bitexact.total_norm(grads) == exact_norm(grads, "float64")
    rel = abs(float(theirs) - ref) / ref
    assert rel <= torch_tolerance(*(g.dtype for g in grads)), f"seed {seed}: torch off by {rel:.3g}"


@pytest.mark.parametrize("norm_type", [1.0, math.inf, 0.0])
@pytest.mark.parametrize("mix", [["float32"], ["float32", "bfloat16"], ["float64"]],
                         ids=lambda m: "+".join(m))
def test_other_norms_exact(norm_type, mix):
    grads = random_tensors(7, mix, count=6)
    ours = bt.get_total_norm(grads, norm_type)
    assert float(ours) == exact_norm(grads, FMT[ours.dtype], norm_type)
    if norm_type != 0.0:  # torch's p = 0 counts tensors, not elements (documented)
        theirs = torch.nn.utils.get_total_norm(grads, norm_type)
        assert ours.dtype == theirs.dtype
        assert abs(float(theirs) - float(ours)) <= torch_tolerance(*(g.dtype for g in grads)) * float(ours)


def test_megatron_flavor():
    grads = random_tensors(3, ["float32", "bfloat16"], count=6, spread=4)
    got = bitexact.total_norm(grads, flavor="megatron_fp32")
    assert got == exact_megatron(grads)


@pytest.mark.parametrize("dtype,values,expect", [
    # sum of squares 1 + 2^-23 + 2^-48 + 2^-80: the fp64 norm is exactly the
    # fp32 midpoint 1 + 2^-24, the true norm is just above it
    (torch.float32, [1.0, 2.0 ** -12, 2.0 ** -12, 2.0 ** -24, 2.0 ** -40], 1 + 2.0 ** -23),
    # the same just below: 1 + 2^-23 - 2^-48 ... rounds down
    (torch.float32, [1.0, 2.0 ** -12, 2.0 ** -12], 1.0),
    # bf16 midpoint 1 + 2^-8: squares 1 + 2^-7 + 2^-16 + 2^-80
    (torch.bfloat16, [1.0, 2.0 ** -4, 2.0 ** -4, 2.0 ** -8, 2.0 ** -40], 1 + 2.0 ** -7),
])
def test_no_double_rounding(dtype, values, expect):
    """Rounding the correctly rounded fp64 norm to fp32/bf16 again would be
    wrong exactly at midpoints: the package resolves them exactly."""
    g = torch.tensor(values, dtype=dtype)
    ours = bt.get_total_norm([g])
    assert ours.dtype == dtype
    assert float(ours) == expect == exact_norm([g], FMT[dtype])


@pytest.mark.parametrize("mix", MIXES, ids=lambda m: "+".join(m))
@pytest.mark.parametrize("active", [True, False], ids=["clipping", "no-clipping"])
def test_scaled_grads_bitwise_torch(mix, active):
    """With the same norm, bitexact's torch-mode scaling is torch's
    clip_grads_with_norm_ bit for bit (including when coef == 1)."""
    grads = random_tensors(11, mix)
    a, b = params_with_grads(grads), params_with_grads(grads)
    norm = float(exact_norm(grads))
    max_norm = norm * (0.37 if active else 3.0)
    total = bt.clip_grad_norm_(a, max_norm)
    torch.nn.utils.clip_grads_with_norm_(b, max_norm, total)
    for k, (p, q) in enumerate(zip(a, b)):
        assert same_bits(p.grad, q.grad), f"tensor {k} ({p.grad.dtype}) differs"
    # bitexact's own clip_grads_with_norm_ too, with torch's norm tensor
    c, d = params_with_grads(grads), params_with_grads(grads)
    tn = torch.nn.utils.get_total_norm([p.grad for p in c])
    bt.clip_grads_with_norm_(c, max_norm, tn)
    torch.nn.utils.clip_grads_with_norm_(d, max_norm, tn)
    assert all(same_bits(p.grad, q.grad) for p, q in zip(c, d))


def test_exact_scale_mode_rounds_once():
    from fractions import Fraction

    from exact_ref import round_fraction
    g = random_tensors(5, ["bfloat16", "float16", "float32"], count=3, max_numel=200)
    coef = 0.3
    p = params_with_grads(g)
    total = bt.get_total_norm(g)
    max_norm = float(total) * coef
    bt.clip_grad_norm_(p, max_norm, scale_mode="exact")
    c = float(torch.clamp(max_norm / (total + 1e-6), max=1.0))
    for orig, got in zip(g, p):
        fmt = FMT[orig.dtype]
        for x, y in zip(orig.double().flatten().tolist(), got.grad.double().flatten().tolist()):
            v = Fraction(x) * Fraction(c)
            want = math.copysign(round_fraction(abs(v), fmt), v) if v else 0.0 * x
            assert y == want


def _models():
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32),
                              torch.nn.Linear(32, 4))
    conv = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                               torch.nn.Linear(8 * 6 * 6, 5))
    tf = torch.nn.TransformerEncoderLayer(d_model=16, nhead=2, dim_feedforward=32,
                                          dropout=0.0, batch_first=True)
    return {
        "mlp": (mlp, lambda: torch.randn(8, 16)),
        "conv": (conv, lambda: torch.randn(2, 3, 8, 8)),
        "transformer": (tf, lambda: torch.randn(2, 5, 16)),
    }


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", ["mlp", "conv", "transformer"])
def test_small_models(name, dtype):
    model, data = _models()[name]
    model = model.to(dtype)
    torch.manual_seed(1)
    x = data().to(dtype)
    model(x).float().pow(2).sum().backward()
    params = [p for p in model.parameters()]
    grads = [p.grad.clone() for p in params if p.grad is not None]
    ref = exact_norm(grads, FMT[dtype])
    # clip with ours, and with torch given our norm: the same bits
    total = bt.clip_grad_norm_(model.parameters(), 0.05)
    assert float(total) == ref and total.dtype == dtype
    other = params_with_grads(grads)
    torch.nn.utils.clip_grads_with_norm_(other, 0.05, total)
    for p, q in zip([p for p in params if p.grad is not None], other):
        assert same_bits(p.grad, q.grad)
    # torch's own norm agrees within its rounding
    tn = torch.nn.utils.get_total_norm(grads)
    assert abs(float(tn) - ref) <= torch_tolerance(dtype) * ref


def test_main_grad_mix():
    """use_main_grad: fp32 main_grad where present, else the bf16/fp16 .grad;
    scaling applies to what was counted."""
    g = random_tensors(4, ["float32", "bfloat16", "float16", "float32"], count=8)
    params = []
    for k, t in enumerate(g):
        if t.dtype == torch.float32:  # Megatron: bf16 param, fp32 main_grad
            p = torch.nn.Parameter(torch.zeros(t.shape, dtype=torch.bfloat16))
            p.main_grad = t.clone()
            p.grad = None if k % 2 else torch.ones(t.shape, dtype=torch.bfloat16)
        else:
            p = torch.nn.Parameter(torch.zeros_like(t))
            p.grad = t.clone()
        params.append(p)
    total = bt.clip_grad_norm_(params, 1e-3, use_main_grad=True)
    assert total.dtype == torch.float32
    assert float(total) == exact_norm(g, "float32")
    ref = params_with_grads(g)
    torch.nn.utils.clip_grads_with_norm_(ref, 1e-3, total)
    for p, q in zip(params, ref):
        got = p.main_grad if hasattr(p, "main_grad") else p.grad
        assert same_bits(got, q.grad)
    # the untouched bf16 .grad of main_grad params is not scaled
    assert all(p.grad is None or torch.all(p.grad == 1) for p in params
               if hasattr(p, "main_grad"))


def test_empty_and_none_grads():
    assert same_bits(bt.get_total_norm([]), torch.nn.utils.get_total_norm([]))
    ps = [torch.nn.Parameter(torch.ones(3)) for _ in range(3)]
    t = bt.clip_grad_norm_(ps, 1.0)
    assert same_bits(t, torch.tensor(0.0))
    ps[1].grad = torch.tensor([3.0, 4.0, 0.0])
    assert float(bt.clip_grad_norm_(ps, 10.0)) == 5.0
    assert float(bt.clip_grad_norm_(ps[1], 10.0)) == 5.0  # a single tensor
    with pytest.warns(UserWarning):
        bt.clip_grad_norm_((p for p in []), 1.0)


def test_invariance_order_threads_split():
    grads = random_tensors(21, ["float32", "bfloat16"], count=20, max_numel=300000)
    ref = bt.get_total_norm(grads)
    assert float(ref) == exact_norm(grads, "float32")
    for threads in (1, 2, 3, 8):
        assert same_bits(bt.get_total_norm(grads, num_threads=threads), ref)
    assert same_bits(bt.get_total_norm(grads[::-1]), ref)
    pieces = [piece for t in grads for piece in t.flatten().split(997)]
    assert same_bits(bt.get_total_norm(pieces), ref)
    # transposed (dense, not contiguous) views: same multiset, same bits
    assert same_bits(bt.get_total_norm([t.T if t.dim() == 2 else t for t in grads]), ref)


def test_nonfinite_without_error_matches_torch():
    g = [torch.tensor([1.0, float("nan")]), torch.tensor([2.0, 3.0])]
    a, b = params_with_grads(g), params_with_grads(g)
    ta = bt.clip_grad_norm_(a, 1.0)
    tb = torch.nn.utils.clip_grad_norm_(b, 1.0)
    assert math.isnan(float(ta)) and math.isnan(float(tb))
    assert all(torch.isnan(p.grad).all() for p in a)
    # the canonical NaN (docs/design.md "NaN"), not the gradient's own NaN
    assert all((p.grad.view(torch.int32) == 0x7FC00000).all() for p in a)
    g = [torch.tensor([1.0, float("inf")]), torch.tensor([2.0, 3.0])]
    g[0].view(torch.int32)[1] = -8388608 + 0x12345  # 0xff812345: a signalling NaN, negative
    a = params_with_grads(g)
    assert math.isnan(float(bt.clip_grad_norm_(a, 1.0)))
    assert all((p.grad.view(torch.int32) == 0x7FC00000).all() for p in a)
    g = [torch.tensor([1.0, float("inf")]), torch.tensor([2.0, 3.0])]
    a, b = params_with_grads(g), params_with_grads(g)
    ta = bt.clip_grad_norm_(a, 1.0)
    tb = torch.nn.utils.clip_grad_norm_(b, 1.0)
    assert float(ta) == float(tb) == math.inf
    for p, q in zip(a, b):
        assert torch.equal(torch.isnan(p.grad), torch.isnan(q.grad))
        assert torch.equal(p.grad.nan_to_num(7.0), q.grad.nan_to_num(7.0))


def test_max_norm_zero_is_torchs():
    """torch's clip_grad_norm_ with max_norm=0 zeroes the gradients; the
    drop-in does the same (the neutral API's max_norm=0 disables clipping)."""
    g = random_tensors(2, ["float32"], count=3)
    a, b = params_with_grads(g), params_with_grads(g)
    bt.clip_grad_norm_(a, 0.0)
    torch.nn.utils.clip_grad_norm_(b, 0.0)
    assert all(same_bits(p.grad, q.grad) for p, q in zip(a, b))
    c = [t.clone() for t in g]
    bitexact.clip_grad_norm(c, 0.0)
    assert all(same_bits(x, y) for x, y in zip(c, g))


def test_version_counters_bumped_like_torch():
    g = random_tensors(9, ["float32", "bfloat16"], count=4)
    a, b = params_with_grads(g), params_with_grads(g)
    bt.clip_grad_norm_(a, 1e-6)
    torch.nn.utils.clip_grad_norm_(b, 1e-6)
    assert [p.grad._version for p in a] == [p.grad._version for p in b]


def _round_ref(d, dtype):
    """d (a float >= 0) rounded once, nearest-even, into dtype (floats only
    where exact: fmod and ldexp)."""
    p, emin, emax = {"float32": (24, -126, 127), "bfloat16": (8, -126, 127),
                     "float16": (11, -14, 15)}[dtype]
    if not d > 0 or math.isinf(d):
        return d
    e = max(math.frexp(d)[1] - 1, emin)
    q = math.ldexp(1.0, e - p + 1)
    r = math.fmod(d, q)
    lo = d - r
    res = lo + q if r > q / 2 else lo if r < q / 2 else (lo if math.fmod(lo / q, 2) == 0
                                                         else lo + q)
    return math.inf if res > math.ldexp(2.0 - math.ldexp(1.0, 1 - p), emax) else res


def test_other_norms_rounded_once_into_norm_dtype():
    """A norm other than 2 and 1 (here max |x| of one fp64 value) in a
    narrower norm_dtype: its value rounded once, by the library (the code
    the CUDA finishing kernel runs too), not twice as torch's fp64 -> fp32
    -> 16-bit conversions do."""
    import random
    rng = random.Random(3)
    vals = [0.0, math.inf, 1.0, 65504.0, 65520.0, 65519.99, 2.0 ** -24, 2.0 ** -25,
            3 * 2.0 ** -26, 1 + 2.0 ** -8 + 2.0 ** -30, 1 + 2.0 ** -11 + 2.0 ** -40,
            2.0 ** -133, 2.0 ** -134, 1.5 * 2.0 ** -134, 3.4e38, 3.5e38, 1e300, 1e-300,
            2.0 ** 24 + 2.0 ** 16 + 1]
    for _ in range(1500):
        p, e = rng.choice([8, 11]), rng.randint(-20, 14)
        mid = math.ldexp(rng.randint(2 ** (p - 1), 2 ** p - 1) + 0.5, e - p + 1)
        vals.append(mid + rng.choice([-1, 1]) * mid * 2.0 ** -rng.randint(25, 52))
        vals.append(math.ldexp(rng.random() + 0.5, rng.randint(-150, 130)))
    twice = 0
    for dt in ("float32", "bfloat16", "float16"):
        for v in vals:
            got = bitexact.total_norm([torch.tensor([-v], dtype=torch.float64)], math.inf,
                                      norm_dtype=dt)
            assert got == _round_ref(v, dt), f"{v!r} -> {dt}: {got!r}, not {_round_ref(v, dt)!r}"
        d = torch.tensor(vals, dtype=torch.float64)
        twice += sum(float(x) != _round_ref(v, dt)
                     for v, x in zip(vals, d.to(getattr(torch, dt)).double()))
    assert twice > 0  # the cases do catch torch's double rounding
    # the count of non-zeros, 2^24 + 2^16 + 1, in bf16: through fp32 it would
    # land on a bf16 midpoint and round down
    n = 2 ** 24 + 2 ** 16 + 1
    g = torch.ones(n, dtype=torch.bfloat16)
    assert float(bt.get_total_norm([g], 0)) == 2.0 ** 24 + 2.0 ** 17
    assert bitexact.total_norm([g], 0, norm_dtype="grads") == 2.0 ** 24 + 2.0 ** 17


@pytest.mark.parametrize("mix", MIXES, ids=lambda m: "+".join(m))
def test_norm_dtype_option(mix):
    """The neutral API's norm_dtype: "grads" is torch's dtype (the drop-ins'
    result), each explicit format the exact norm rounded once into it, the
    group norms too."""
    grads = random_tensors(13, mix, count=6)
    ours = bt.get_total_norm(grads)
    assert bitexact.total_norm(grads, norm_dtype="grads") == float(ours)
    assert bitexact.total_norm(grads, norm_dtype=ours.dtype) == float(ours)
    for fmt in ("float64", "float32", "bfloat16", "float16"):
        for p in (2.0, 1.0):
            assert bitexact.total_norm(grads, p, norm_dtype=fmt) == exact_norm(grads, fmt, p)
        labels = ["a", "b"] * 3
        total, per = bitexact.total_norm(grads, groups=labels, norm_dtype=fmt)
        assert total == exact_norm(grads, fmt)
        assert per["b"] == exact_norm(grads[1::2], fmt)
    with pytest.raises(ValueError, match="norm_dtype"):
        bitexact.total_norm(grads, norm_dtype="int8")


def test_midpoint_resolved_without_extra_collective():
    """The fp64 norm is exactly an fp32 midpoint: the library rounds the
    exact sum once into fp32 itself, so a communicator sees the agreement
    step and the norm's one reduction, nothing more."""
    g = torch.tensor([1.0, 2.0 ** -12, 2.0 ** -12, 2.0 ** -24, 2.0 ** -40], dtype=torch.float32)
    calls = []
    comm = bitexact.Comm(lambda buf, op: calls.append((op, len(buf) // 8)))
    assert bitexact.total_norm([g], comm=comm, norm_dtype="grads") == 1 + 2.0 ** -23
    assert [op for op, _ in calls] == ["max", "sum"]
    assert calls[1][1] == bitexact._core.ACC_WORDS
    calls.clear()
    a = [g.clone()]
    assert bitexact.clip_grad_norm(a, 0.5, comm=comm, norm_dtype="float32") == 1 + 2.0 ** -23
    assert [op for op, _ in calls] == ["max", "sum"]
    coef = bitexact.clip_coef(1 + 2.0 ** -23, 0.5)  # from the fp32 norm
    assert same_bits(a[0], g * torch.tensor(coef, dtype=torch.float32))
