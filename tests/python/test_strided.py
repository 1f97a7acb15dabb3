"""Strided gradients (issue 15): views with gaps, transposed, expanded,
as_strided with gaps and with overlaps, the columns of one buffer as
separate gradients; and negative norm_type.

The C library reads every logical element of any layout, so a view's norm
is bitwise the norm of its .contiguous() copy; scaling writes each logical
element once, so a clip gives torch's bits (same norm, same coefficient,
torch's arithmetic) and leaves the bytes between elements alone. A
gradient whose logical elements overlap in memory (expanded, or
overlapping as_strided) cannot be scaled in place: LayoutError, as torch's
own mul_ refuses it, nothing modified."""
import math

import pytest
import torch

import bitexact
import bitexact.torch as bt
from exact_ref import exact_norm
from helpers import FMT, same_bits

PRECISION = {torch.float64: 53, torch.float32: 24, torch.bfloat16: 8, torch.float16: 11}
P_VALUES = [2.0, 1.0, math.inf, -math.inf, 0.0, 3.0, 0.5, -1.0, -0.5, -2.0]


def _buffer(seed, shape, dtype):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float64) * 2.0 ** torch.randint(
        -6, 7, shape, generator=g).double()
    x = x.to(dtype)
    x[x == 0] = 1.0  # no zeros (a zero makes a p < 0 norm 0)
    return x


def _views(dtype):
    """(name, view) pairs: every one strided (not contiguous)."""
    buf = _buffer(1, (24, 30), dtype)
    base = _buffer(2, (600,), dtype)
    return [
        ("g[:, ::2]", buf[:, ::2]),
        ("g.t()", buf.t()),
        ("g[3:17, 5:20]", buf[3:17, 5:20]),
        ("g[::3, 1::4].t()", buf[::3, 1::4].t()),
        ("expand(4, 3)", _buffer(3, (1, 3), dtype).expand(4, 3)),
        ("expand(5, 24, 30)", buf.expand(5, 24, 30)),
        ("as_strided gaps", base.as_strided((7, 9), (40, 3), 11)),
        ("as_strided overlap", base.as_strided((10, 10), (5, 1), 2)),
        ("column", buf[:, 7]),
    ]


def _torch_tol(dtype, p):
    """torch's norm: |x|^p and the per-tensor sums in the grad dtype (fp32
    accumulation for fp16/bf16), each per-tensor norm rounded to the grad
    dtype, then combined: a few units of 2^-precision plus the fp32
    summation error of thousands of terms (~1e-6), both amplified by
    |1/p| through the root for p other than 2 and 1."""
    base = 8 * 2.0 ** -PRECISION[dtype] + 2e-6
    return base if p in (2.0, 1.0) else (1 + abs(1 / p)) * base


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16],
                         ids=lambda d: FMT[d])
@pytest.mark.parametrize("norm_type", P_VALUES, ids=str)
def test_view_norm_is_the_contiguous_copy_norm(dtype, norm_type):
    for name, v in _views(dtype):
        assert not v.is_contiguous(), name
        ours = bt.get_total_norm([v], norm_type)
        want = bt.get_total_norm([v.contiguous()], norm_type)
        assert same_bits(ours, want), f"{name}: {ours!r} vs copy {want!r}"
        theirs = torch.nn.utils.get_total_norm([v], norm_type)
        assert ours.dtype == theirs.dtype
        if norm_type in (2.0, 1.0, math.inf, 0.0):  # exactly rounded: vs the exact reference
            assert float(ours) == exact_norm([v.contiguous()], FMT[ours.dtype], norm_type), name
        t, o = float(theirs), float(ours)
        if norm_type == 0.0:  # torch's total counts tensors (a known torch bug): not compared
            continue
        if norm_type == math.inf or norm_type == -math.inf:
            assert t == o, f"{name}: torch {t!r} vs {o!r}"
        elif not (t == o == math.inf):  # both overflow (fp16, p = 3 or 0.5)
            assert abs(t - o) <= _torch_tol(dtype, norm_type) * abs(o), f"{name} p={norm_type}: {t!r} vs {o!r}"


def _as_params(grads):
    """Parameters whose .grad are exactly these tensors (views kept)."""
    params = []
    for g in grads:
        p = torch.nn.Parameter(torch.zeros(g.shape, dtype=g.dtype))
        p.grad = g
        assert p.grad.data_ptr() == g.data_ptr() and p.grad.stride() == g.stride()
        params.append(p)
    return params


def test_columns_of_one_buffer_as_grads():
    buf = _buffer(4, (50, 12), torch.float32)
    cols = [buf[:, j] for j in range(12)]
    ours = bt.get_total_norm(cols)
    assert same_bits(ours, bt.get_total_norm([buf]))
    # interleaved but disjoint: a clip scales each element once, as torch
    ref, keep = buf.clone(), buf.clone()
    total = bt.clip_grad_norm_(_as_params(cols), 0.5)
    torch.nn.utils.clip_grads_with_norm_(_as_params([ref[:, j] for j in range(12)]), 0.5, total)
    assert same_bits(buf, ref) and not same_bits(buf, keep)
    # the even and odd columns as two gradients
    ref, keep = buf.clone(), buf.clone()
    total = bt.clip_grad_norm_(_as_params([buf[:, 0::2], buf[:, 1::2]]), 0.1)
    torch.nn.utils.clip_grads_with_norm_(_as_params([ref[:, 0::2], ref[:, 1::2]]), 0.1, total)
    assert same_bits(buf, ref) and not same_bits(buf, keep)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64],
                         ids=lambda d: FMT[d])
@pytest.mark.parametrize("norm_type", [2.0, 1.0, math.inf, -1.0])
def test_clip_strided_grads_bitwise_torch(dtype, norm_type):
    buf = _buffer(5, (40, 30), dtype)
    base = _buffer(6, (900,), dtype)
    if norm_type < 0:  # |x| >= 1: a p < 0 norm far from fp16's subnormals
        buf = buf.sign() * (buf.abs() + 1)
        base = base.sign() * (base.abs() + 1)
    keep_buf, keep_base = buf.clone(), base.clone()
    def views(b, c):
        return [b[:, ::2], b[::3, 1::2].t(), c.as_strided((7, 9), (40, 3), 11), c[400:700:3]]
    grads = views(buf, base)
    refs = [buf.clone(), base.clone()]
    ref_grads = views(*refs)
    max_norm = 0.5 * float(bt.get_total_norm(grads, norm_type))  # active
    total = bt.clip_grad_norm_(_as_params(grads), max_norm, norm_type)
    assert same_bits(total, bt.get_total_norm([r.contiguous() for r in ref_grads], norm_type))
    torch.nn.utils.clip_grads_with_norm_(_as_params(ref_grads), max_norm, total)
    assert same_bits(buf, refs[0]) and same_bits(base, refs[1])
    assert not same_bits(buf, keep_buf), "the clip was active"
    # the bytes outside the views are untouched
    mask = torch.ones(900, dtype=torch.bool)
    mask[torch.as_strided(torch.arange(900), (7, 9), (40, 3), 11).flatten()] = False
    mask[400:700:3] = False
    assert same_bits(base[mask], keep_base[mask])
    assert not same_bits(base, keep_base)
    bmask = torch.ones(40, 30, dtype=torch.bool)
    bmask[:, ::2] = False
    bmask[::3, 1::2] = False
    assert same_bits(buf[bmask], keep_buf[bmask]), "odd columns outside the views untouched"


@pytest.mark.parametrize("make,torch_refuses", [
    (lambda: torch.randn(1, 3).expand(4, 3), True),
    (lambda: torch.randn(7).as_strided((4, 4), (1, 1)), False),
    (lambda: torch.randn(40).as_strided((4, 4), (4, 2)), False),
], ids=["expand", "as_strided [1,1]", "as_strided [4,2]"])
def test_overlapping_grad_refused(make, torch_refuses):
    """torch's mul_ refuses a stride-0 (expanded) tensor; it lets other
    self-overlapping as_strided views through (its check is "maybe" for
    them) and then scales a shared element more than once. bitexact
    decides exactly and refuses both."""
    g = make()
    owner = g._base if g._base is not None else g
    if torch_refuses:
        with pytest.raises(RuntimeError, match="single memory location"):
            make().mul_(1.0)
    else:
        make().mul_(1.0)  # accepted by torch
    keep = owner.clone()
    p = torch.nn.Parameter(torch.zeros(g.shape))
    p.grad = g
    with pytest.raises(bitexact.LayoutError, match="share memory|expanded"):
        bt.clip_grad_norm_([p], 1e-6)
    assert same_bits(owner, keep), "nothing modified"
    # an inactive clip (coefficient 1) refuses it too, as torch's mul_ by 1
    with pytest.raises(bitexact.LayoutError, match=r"^clip_grad_norm_: parameters\[0\]: "):
        bt.clip_grad_norm_([p], 1e9)
    assert same_bits(owner, keep), "nothing modified"
    with pytest.raises(bitexact.LayoutError):
        bt.clip_grads_with_norm_([p], 1e-6, torch.tensor(1.0))
    assert same_bits(owner, keep), "nothing modified"
    # the norm reads it: bitwise the contiguous copy's, close to torch's
    ours = bt.get_total_norm([g])
    assert same_bits(ours, bt.get_total_norm([g.contiguous()]))
    assert float(ours) == pytest.approx(float(torch.nn.utils.get_total_norm([g])), rel=1e-6)


def test_sharing_views_refused_disjoint_accepted():
    buf = torch.randn(20, 8)
    keep = buf.clone()
    ps = [torch.nn.Parameter(torch.zeros(20, 4)) for _ in range(2)]
    ps[0].grad, ps[1].grad = buf[:, 0::2], buf[:, ::2]  # the same elements twice
    with pytest.raises(bitexact.LayoutError, match="share memory"):
        bt.clip_grad_norm_(ps, 1e-6)
    assert same_bits(buf, keep)
    ps[1].grad = buf[:, 1::2]
    bt.clip_grad_norm_(ps, 1e-6)
    assert not same_bits(buf, keep)


@pytest.mark.parametrize("norm_type", [-0.1, -1.0, -2.0, -0.5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16],
                         ids=lambda d: FMT[d])
def test_negative_p_close_to_torch_and_order_invariant(norm_type, dtype):
    g = torch.Generator().manual_seed(7)
    grads = [(torch.rand(n, generator=g, dtype=torch.float64) + 0.05).to(dtype) *
             (1 if k % 2 else -1) for k, n in enumerate([300, 1000, 57, 2000])]
    ours = bt.get_total_norm(grads, norm_type)
    theirs = torch.nn.utils.get_total_norm(grads, norm_type)
    # torch: |x|^p and the sums in the grad dtype (fp32 for bf16 inside the
    # kernel, each per-tensor norm rounded to bf16), then the norm of the
    # norms; ours from fp64 terms and an exact sum: close, not equal.
    # Relative error of torch's: its rounding of the per-tensor norms and
    # of the sums, amplified by |1/p| through the root, so |1/p| units of
    # the dtype's precision (a few thousand fp32 additions included).
    tol = (4 + 2 * abs(1 / norm_type)) * 2.0 ** -PRECISION[dtype] + 1e-5
    if dtype == torch.float64:
        tol = 1e-12 * (1 + abs(1 / norm_type))
    assert ours.dtype == theirs.dtype
    assert abs(float(ours) - float(theirs)) <= tol * float(theirs), (float(ours), float(theirs))
    for perm in ([3, 1, 0, 2], [2, 3, 1, 0]):
        assert same_bits(bt.get_total_norm([grads[i] for i in perm], norm_type), ours)
    parts = [t for x in grads for t in x.split(97)]
    assert same_bits(bt.get_total_norm(parts, norm_type), ours), "split into pieces"
    assert same_bits(bt.get_total_norm(grads, norm_type, num_threads=3), ours)
    # the neutral API (fp64) agrees with the drop-in rounded once
    assert bitexact.total_norm(grads, norm_type=norm_type) == pytest.approx(float(ours),
                                                                              rel=2 ** -7)


@pytest.mark.parametrize("norm_type", [-0.1, -1.0, -2.0])
def test_negative_p_zeros_inf_nan_like_torch(norm_type):
    x = torch.rand(100) + 0.1
    z = x.clone()
    z[17] = 0.0
    assert float(bt.get_total_norm([z], norm_type)) == 0.0
    assert float(torch.nn.utils.get_total_norm([z], norm_type)) == 0.0
    # a zero with error_if_nonfinite: finite (0), no error, as torch
    assert float(bt.get_total_norm([z], norm_type, error_if_nonfinite=True)) == 0.0
    i = x.clone()
    i[3] = math.inf
    ours, theirs = bt.get_total_norm([i], norm_type), torch.nn.utils.get_total_norm([i], norm_type)
    assert same_bits(ours, bt.get_total_norm([torch.cat([x[:3], x[4:]])], norm_type))
    assert abs(float(ours) - float(theirs)) <= 1e-5 * float(theirs)
    n = x.clone()
    n[5] = math.nan
    assert math.isnan(float(bt.get_total_norm([n], norm_type)))
    assert math.isnan(float(torch.nn.utils.get_total_norm([n], norm_type)))
    with pytest.raises(bitexact.NonFiniteError):
        bt.get_total_norm([n], norm_type, error_if_nonfinite=True)
    # clipping with a zero gradient element: the norm is 0, nothing changes
    p = torch.nn.Parameter(torch.zeros(100))
    p.grad = z.clone()
    total = bt.clip_grad_norm_([p], 1.0, norm_type)
    assert float(total) == 0.0 and same_bits(p.grad, z)
