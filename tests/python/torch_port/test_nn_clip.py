"""Port of the clip_grad_norm_ cases of PyTorch's test/test_nn.py
(TestNNDeviceType.test_clip_grad_norm, test_clip_grad_norm_error_if_nonfinite,
test_clip_grad_norm_multi_device), written anew for bitexact: the same
scenarios and assertions with torch.nn.utils.clip_grad_norm_ /
get_total_norm / clip_grads_with_norm_ replaced by bitexact.torch's, on the
CPU. Where upstream compares with a float computation under a tolerance
the comparison is kept, and bitexact's own guarantee is added: the bits of
the exact norm (exact_ref.exact_norm) where a reference exists (p = 1, 2,
inf, 0), the same bits whatever the order or split of the gradients for
the other p. Cases where bitexact differs on purpose assert bitexact's
documented behaviour. The case-by-case table: docs/torch_port.md.
"""
import math
import warnings

import pytest
import torch
import torch.nn as nn

import bitexact
from bitexact.torch import clip_grad_norm_, clip_grads_with_norm_, get_total_norm
from exact_ref import exact_norm
from helpers import FMT, same_bits

inf, nan = math.inf, math.nan




def _close(a, b):
    """upstream's assertEqual on float tensors/numbers: fp32 defaults."""
    torch.testing.assert_close(torch.as_tensor(a, dtype=torch.float32),
                               torch.as_tensor(b, dtype=torch.float32))


# ---- test_clip_grad_norm --------------------------------------------------

NORM_TYPES = (0.5, 1.5, 2, 4, "inf")
EXACT_P = {1.0, 2.0, inf, 0.0}  # the orders exact_ref covers


def _linear_with(grads):
    torch.manual_seed(0)
    lin = nn.Linear(10, 10)
    for p, g in zip(lin.parameters(), grads):
        p.grad = g.clone().view_as(p)
    return lin


def _compute_norm(lin, norm_type):
    """upstream's reference: the norm in fp32 torch arithmetic."""
    norm_type = float(norm_type)
    if norm_type != inf:
        total = 0
        for p in lin.parameters():
            total += p.grad.abs().pow(norm_type).sum()
        return pow(total, 1.0 / norm_type)
    return max(p.grad.abs().max() for p in lin.parameters())


def _scale(lin, grads):
    """upstream's compare_scaling: every element scaled by one factor."""
    scale = torch.cat([p.grad.div(g.view_as(p)).view(-1) for p, g in zip(lin.parameters(), grads)])
    _close(scale.std(), 0.0)
    return scale[0]


def _big_grads():
    return torch.arange(1.0, 101).view(10, 10), torch.ones(10).div(1000)


def _assert_exact(norm, grads, norm_type):
    """bitexact's guarantee: the exact norm's bits (p with a reference), and
    the same bits for the gradients reversed and cut in pieces (every p)."""
    p = float(norm_type)
    if p in EXACT_P:
        assert float(norm) == exact_norm(grads, FMT[norm.dtype], p), (float(norm), p)
    pieces = [piece for g in reversed(grads) for piece in g.flatten().split(7)]
    assert same_bits(get_total_norm(pieces, norm_type), norm)


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("norm_type", NORM_TYPES)
def test_clip_grad_norm(norm_type, foreach):
    max_norm = 2
    grads = _big_grads()
    lin = _linear_with(grads)
    norm_before = _compute_norm(lin, norm_type)
    norm = clip_grad_norm_(lin.parameters(), max_norm, norm_type=norm_type, foreach=foreach)
    norm_after = _compute_norm(lin, norm_type)
    _close(norm, norm_before)
    _close(norm_after, max_norm)
    assert norm_after <= norm_before
    _scale(lin, grads)
    _assert_exact(norm, list(grads), norm_type)
    # the clipped gradients are torch's own, bit for bit, given the norm
    ref = _linear_with(grads)
    torch.nn.utils.clip_grads_with_norm_(ref.parameters(), max_norm, norm, foreach=foreach)
    for p, q in zip(lin.parameters(), ref.parameters()):
        assert same_bits(p.grad, q.grad)


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("norm_type", NORM_TYPES)
def test_clip_grad_norm_decomposed(norm_type, foreach):
    """upstream's 'decomposed APIs should behave as expected' block."""
    max_norm = 2
    grads = _big_grads()
    lin = _linear_with(grads)
    norm_before = _compute_norm(lin, norm_type)
    total = get_total_norm([p.grad for p in lin.parameters()], norm_type=norm_type,
                           foreach=foreach)
    clip_grads_with_norm_(lin.parameters(), max_norm, total, foreach=foreach)
    norm_after = _compute_norm(lin, norm_type)
    _close(total, norm_before)
    _close(norm_after, max_norm)
    assert norm_after <= norm_before
    _scale(lin, grads)
    # the two halves give clip_grad_norm_'s bits
    one = _linear_with(grads)
    assert same_bits(clip_grad_norm_(one.parameters(), max_norm, norm_type, foreach=foreach),
                     total)
    for p, q in zip(lin.parameters(), one.parameters()):
        assert same_bits(p.grad, q.grad)


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("norm_type", NORM_TYPES)
def test_clip_grad_norm_small_unchanged(norm_type, foreach):
    """upstream: small gradients are left unchanged (scale exactly 1)."""
    max_norm = 2
    g = torch.Generator().manual_seed(3)
    grads = torch.rand(10, 10, generator=g).div(10000), torch.ones(10).div(500)
    lin = _linear_with(grads)
    before = [p.grad.clone() for p in lin.parameters()]
    norm_before = _compute_norm(lin, norm_type)
    norm = clip_grad_norm_(lin.parameters(), max_norm, norm_type=norm_type, foreach=foreach)
    norm_after = _compute_norm(lin, norm_type)
    _close(norm, norm_before)
    _close(norm_before, norm_after)
    assert norm_after <= max_norm
    assert float(_scale(lin, grads)) == 1.0
    assert all(same_bits(p.grad, b) for p, b in zip(lin.parameters(), before))
    _assert_exact(norm, list(grads), norm_type)


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("norm_type", NORM_TYPES)
def test_clip_grad_norm_single_tensor(norm_type, foreach):
    """upstream: a single Tensor is accepted as well as a list of one."""
    p1, p2 = torch.randn(10, 10), torch.randn(10, 10)
    g = torch.arange(1.0, 101).view(10, 10)
    p1.grad, p2.grad = g.clone(), g.clone()
    n1 = clip_grad_norm_(p1, 2, norm_type=norm_type, foreach=foreach)
    n2 = clip_grad_norm_([p2], 2, norm_type=norm_type, foreach=foreach)
    assert same_bits(p1.grad, p2.grad) and same_bits(n1, n2)
    assert not torch.equal(p1.grad, g)


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("norm_type", NORM_TYPES)
def test_clip_grad_norm_empty_generator_warns(norm_type, foreach):
    lin = _linear_with(_big_grads())
    params = lin.parameters()
    for _ in params:
        pass
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        total = clip_grad_norm_(params, 2, norm_type=norm_type, foreach=foreach)
    assert len(w) == 1
    assert str(w[0].message) == ("`parameters` is an empty generator, no gradient clipping "
                                 "will occur.")
    assert float(total) == 0.0


# ---- test_clip_grad_norm_error_if_nonfinite -------------------------------

NORMS_POS = [0.1, 1, 2, 3.5, inf]
NORMS_NEG = [-0.1, -1, -2, -3.5]
NORMS_NEG_PLUS_0 = [0] + NORMS_NEG
NORMS_EXCEPT_0 = NORMS_POS + NORMS_NEG
NORMS_ALL = [0] + NORMS_EXCEPT_0

# upstream's table: (grad_only_one_elem, prefix_finite_grad_param, scalars,
# norms torch finds non-finite, norms torch finds finite)
NONFINITE_TABLE = [
    # an infinite gradient
    (False, False, [inf, -inf], NORMS_EXCEPT_0, [0]),
    (False, True, [inf, -inf], NORMS_POS, NORMS_NEG_PLUS_0),
    (True, False, [inf, -inf], NORMS_POS, NORMS_NEG_PLUS_0),
    (True, True, [inf, -inf], NORMS_POS, NORMS_NEG_PLUS_0),
    # a NaN gradient
    (False, False, [nan], NORMS_EXCEPT_0, [0]),
    (False, True, [nan], NORMS_EXCEPT_0, [0]),
    (True, False, [nan], NORMS_EXCEPT_0, [0]),
    (True, True, [nan], NORMS_EXCEPT_0, [0]),
    # a gradient that never errors
    (False, False, [2e22, -2e22], [], NORMS_ALL),
    (False, True, [2e22, -2e22], [], NORMS_ALL),
    (True, False, [2e22, -2e22], [], NORMS_ALL),
    (True, True, [2e22, -2e22], [], NORMS_ALL),
    # torch's float64 sums overflow (or underflow) for some orders only
    (False, False, [2e200, -2e200], [3.5, 2, -2, -3.5], [inf, 1, 0.1, 0, -1, -0.1]),
    (False, True, [2e200, -2e200], [3.5, 2], [inf, 1, 0.1, 0, -1, -0.1, -2, -3.5]),
    (True, False, [2e200, -2e200], [3.5, 2], [inf, 1, 0.1, 0, -1, -0.1, -2, -3.5]),
    (True, True, [2e200, -2e200], [3.5, 2], [inf, 1, 0.1, 0, -1, -0.1, -2, -3.5]),
]


def _nonfinite_cases():
    """One pytest case per (table row, norm_type); the scalars,
    error_if_nonfinite and foreach loop inside (bitexact ignores foreach)."""
    out = []
    for row, (one_elem, prefix, scalars, bad, good) in enumerate(NONFINITE_TABLE):
        for norm_type, torch_nonfinite in [(n, True) for n in bad] + [(n, False) for n in good]:
            out.append(pytest.param(row, norm_type, torch_nonfinite,
                                    id=f"row{row}-p{norm_type:g}"))
    return out


def _gen_parameters(scalar, one_elem, prefix):
    param = torch.ones(10, dtype=torch.double, requires_grad=True)
    if one_elem:
        param[1].mul(scalar).sum().backward()
    else:
        param.mul(scalar).sum().backward()
    params = []
    if prefix:
        pre = torch.ones(1, dtype=torch.double, requires_grad=True)
        pre.mul(1).sum().backward()
        params.append(pre)
    params.append(param)
    return params


@pytest.mark.parametrize("row,norm_type,torch_nonfinite", _nonfinite_cases())
def test_clip_grad_norm_error_if_nonfinite(row, norm_type, torch_nonfinite):
    one_elem, prefix, scalars, _, _ = NONFINITE_TABLE[row]
    for scalar in scalars:
        # differs on purpose: p = 1 and 2 are summed exactly, so 2e200's
        # squares do not overflow as torch's float64 sum does (the norm is
        # finite, the exact one); other p are computed from their value
        # and overflow like torch's
        differs = torch_nonfinite and abs(scalar) == 2e200 and float(norm_type) in (1.0, 2.0)
        nonfinite = torch_nonfinite and not differs
        for eif in (False, True):
            for foreach in (False, True):
                _check_nonfinite_case(scalar, one_elem, prefix, norm_type, eif, foreach,
                                      nonfinite)


def _check_nonfinite_case(scalar, one_elem, prefix, norm_type, eif, foreach, nonfinite):
    params = _gen_parameters(scalar, one_elem, prefix)
    before = [p.grad.clone() for p in params]
    what = f"scalar {scalar}, error_if_nonfinite {eif}, foreach {foreach}"
    if nonfinite and eif:
        with pytest.raises(RuntimeError) as err:
            clip_grad_norm_(params, 1.0, norm_type=norm_type, error_if_nonfinite=True,
                            foreach=foreach)
        # raised for the non-finite norm (not, e.g., a refused norm_type)
        assert isinstance(err.value, bitexact.NonFiniteError), (what, repr(err.value))
        # the gradients are untouched by the failed call
        assert all(same_bits(p.grad, b) for p, b in zip(params, before)), what
        return
    total = clip_grad_norm_(params, 1.0, norm_type=norm_type, error_if_nonfinite=eif,
                            foreach=foreach)
    if not nonfinite:
        assert math.isfinite(float(total)), what
        if float(norm_type) in EXACT_P:  # p = 0 counts elements (on purpose)
            assert float(total) == exact_norm(before, "float64", float(norm_type)), what
    else:
        assert not math.isfinite(float(total)), what


@pytest.mark.parametrize("norm_type", [0.1, 1, 2, 3.5, inf])
def test_clip_grad_norm_error_if_nonfinite_message(norm_type):
    """upstream matches torch's message; bitexact puts its detail after it."""
    params = _gen_parameters(inf, False, False)
    with pytest.raises(RuntimeError, match=(f"^The total norm of order {float(norm_type)} for "
                                            "gradients from `parameters` is non-finite")):
        clip_grad_norm_(params, 1.0, norm_type=norm_type, error_if_nonfinite=True)


def test_clip_grad_norm_error_is_runtime_error():
    """torch raises RuntimeError: bitexact's NonFiniteError is one."""
    assert issubclass(bitexact.NonFiniteError, RuntimeError)


# ---- test_clip_grad_norm_multi_device ------------------------------------

class _TwoLayers(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer1 = nn.Linear(10, 10)
        self.layer2 = nn.Linear(10, 10)


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("norm_type", [2.0, inf])
def test_clip_grad_norm_multi_module(norm_type, foreach):
    """upstream's multi-device case on one device: the two layers' norm and
    clipped gradients equal a reference model's (the cross-device part
    needs two CUDA devices: see the next test and docs/torch_port.md)."""
    test_model, ref_model = _TwoLayers(), _TwoLayers()
    for m in (test_model, ref_model):
        for p in m.parameters():
            p.grad = torch.ones_like(p)
    norm = clip_grad_norm_(test_model.parameters(), 0.5, norm_type=norm_type, foreach=foreach)
    expected = clip_grad_norm_(ref_model.parameters(), 0.5, norm_type=norm_type, foreach=foreach)
    assert same_bits(norm, expected)
    torch.testing.assert_close(norm, torch.nn.utils.get_total_norm(
        [torch.ones_like(p) for p in ref_model.parameters()], norm_type))
    for p, pe in zip(test_model.parameters(), ref_model.parameters()):
        assert same_bits(p.grad, pe.grad)


def _mixed_model(device):
    model = _TwoLayers()
    model.layer2.to(device)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    return model


def test_clip_grad_norm_mixed_devices_refused_meta():
    """Differs on purpose: torch accepts gradients on several devices in one
    call; bitexact refuses (an error naming the gradient) and changes
    nothing. Here with a CPU and a meta layer (meta cannot be exported)."""
    model = _mixed_model("meta")
    before = [p.grad.clone() for p in model.layer1.parameters()]
    with pytest.raises(bitexact.Error, match=r"parameters\[2\]"):
        clip_grad_norm_(model.parameters(), 0.5)
    assert all(same_bits(p.grad, b) for p, b in zip(model.layer1.parameters(), before))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (CPU + CUDA mix)")
def test_clip_grad_norm_mixed_devices_refused_cuda():
    model = _mixed_model("cuda")
    before = [p.grad.clone() for p in model.layer1.parameters()]
    with pytest.raises(bitexact.DeviceError):
        clip_grad_norm_(model.parameters(), 0.5)
    assert all(same_bits(p.grad, b) for p, b in zip(model.layer1.parameters(), before))
