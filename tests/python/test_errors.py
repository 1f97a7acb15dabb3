"""Bad inputs: the documented exception, the parameter named, nothing
modified."""
import math
import re
import types

import numpy as np
import pytest
import torch

import bitexact
import bitexact.torch as bt
from helpers import params_with_grads, random_tensors, same_bits


def _model_params():
    g = random_tensors(61, ["float32", "bfloat16"], count=5)
    return params_with_grads(g)


def _snapshot(params):
    return [None if p.grad is None else p.grad.clone() for p in params]


def _unchanged(params, snap):
    return all((p.grad is None and s is None) or same_bits(p.grad, s)
               for p, s in zip(params, snap))


def _bad_cases():
    ps = []

    def add(name, make_grad, exc, match):
        ps.append(pytest.param(make_grad, exc, match, id=name))
    add("int32", lambda: torch.ones(4, dtype=torch.int32), TypeError, "int32")
    add("int64", lambda: torch.ones(4, dtype=torch.int64), bitexact.DTypeError, "int64")
    add("bool", lambda: torch.ones(4, dtype=torch.bool), TypeError, "not supported")
    # strided views with gaps and expanded ones are read by norms (issue 15:
    # test_strided.py); an expanded one cannot be scaled in place (there).
    # Complex and sparse COO gradients are accepted (test_torch_compat.py);
    # the compressed sparse layouts are refused there
    return ps


@pytest.mark.parametrize("make_grad,exc,match", _bad_cases())
def test_bad_gradient_refused_nothing_modified(make_grad, exc, match):
    params = _model_params()
    # torch refuses to attach such a .grad to a Parameter; the functions
    # only read .grad, as torch's do
    params.insert(3, types.SimpleNamespace(grad=make_grad()))
    snap = _snapshot(params)
    with pytest.raises(exc, match=match) as info:
        bt.clip_grad_norm_(params, 1e-3)
    assert isinstance(info.value, bitexact.Error)
    assert "parameters[3]" in str(info.value)
    assert _unchanged(params, snap)
    with pytest.raises(exc, match=r"tensors\[3\]"):
        bt.get_total_norm([p.grad for p in params])


def test_nonfinite_error_names_parameter_and_modifies_nothing():
    params = _model_params()
    params[2].grad.view(-1)[5] = float("nan")
    params[4].grad.view(-1)[0] = float("inf")
    snap = _snapshot(params)
    with pytest.raises(RuntimeError, match=r"parameters\[2\] holds NaN") as info:
        bt.clip_grad_norm_(params, 1e-3, error_if_nonfinite=True)
    assert isinstance(info.value, bitexact.NonFiniteError)
    assert _unchanged(params, snap)
    params[2].grad.view(-1)[5] = 0.0
    with pytest.raises(bitexact.NonFiniteError, match=r"parameters\[4\] holds an infinite"):
        bt.clip_grad_norm_(params, 1e-3, error_if_nonfinite=True)
    # torch raises the same class of error
    with pytest.raises(RuntimeError):
        torch.nn.utils.clip_grad_norm_(params, 1e-3, error_if_nonfinite=True)


@pytest.mark.parametrize("max_norm", [-1.0, math.nan])
def test_bad_max_norm(max_norm):
    params = _model_params()
    snap = _snapshot(params)
    with pytest.raises(ValueError, match="max_norm"):
        bt.clip_grad_norm_(params, max_norm)
    with pytest.raises(ValueError, match="max_norm"):
        bitexact.clip_grad_norm([p.grad for p in params], max_norm)
    assert _unchanged(params, snap)


@pytest.mark.parametrize("norm_type", [math.nan])  # p < 0: test_strided.py
def test_bad_norm_type(norm_type):
    params = _model_params()
    snap = _snapshot(params)
    with pytest.raises(ValueError, match="norm_type"):
        bt.clip_grad_norm_(params, 1e-3, norm_type)
    assert _unchanged(params, snap)


def test_bad_options():
    with pytest.raises(ValueError, match="scale_mode"):
        bt.clip_grad_norm_(_model_params(), 1.0, scale_mode="fast")
    with pytest.raises(ValueError, match="flavor"):
        bitexact.total_norm([np.ones(2)], flavor="approximate")
    with pytest.raises(ValueError, match="Megatron|MEGATRON"):
        bitexact.total_norm([np.ones(2)], norm_type=1.0, flavor="megatron_fp32")


def test_not_a_tensor():
    with pytest.raises(TypeError, match=r"tensors\[1\].*list"):
        bitexact.total_norm([np.ones(2), [1.0, 2.0]])
    with pytest.raises(bitexact.DTypeError):
        bitexact.total_norm([np.ones(2), "x"])


def test_overlapping_scale_refused():
    base = torch.arange(10, dtype=torch.float32)
    snap = base.clone()
    with pytest.raises(bitexact.LayoutError, match=r"tensors\[0\] and tensors\[1\] share memory"):
        bitexact.scale([base, base[2:5]], 0.5)
    assert same_bits(base, snap)
    p = torch.nn.Parameter(torch.zeros(10))
    p.grad = base
    q = torch.nn.Parameter(torch.zeros(10))
    q.grad = base  # the same gradient twice: each element must be scaled once
    with pytest.raises(ValueError, match="share memory"):
        bt.clip_grad_norm_([p, q], 1e-3)
    assert same_bits(base, snap)


def test_meta_device_refused():
    p = torch.nn.Parameter(torch.zeros(3, device="meta"))
    p.grad = torch.zeros(3, device="meta")
    with pytest.raises(ValueError, match=r"parameters\[0\].*DLPack"):
        bt.clip_grad_norm_([p], 1.0)


def test_exception_hierarchy():
    for cls, builtin in [(bitexact.InvalidArgumentError, ValueError),
                         (bitexact.LayoutError, ValueError),
                         (bitexact.DeviceError, ValueError),
                         (bitexact.DTypeError, TypeError),
                         (bitexact.OutOfMemoryError, MemoryError),
                         (bitexact.NonFiniteError, RuntimeError),
                         (bitexact.CommError, RuntimeError),
                         (bitexact.MismatchError, RuntimeError)]:
        assert issubclass(cls, bitexact.Error) and issubclass(cls, builtin)
        assert issubclass(cls, RuntimeError)
    try:
        bitexact.total_norm([np.ones(2, dtype=np.int8)])
    except bitexact.Error as e:
        assert e.status == 2  # BX_EDTYPE


def _no_position_left(msg):
    """The library's positions ("group 1, tensor 2", "tensor 2") are all
    replaced by the caller's names."""
    return re.search(r"\bgroup \d|\btensor \d", msg) is None


def test_error_location_attributes():
    """Errors carry where they are as integers (bx_last_error_location): the
    message's names come from them, not from the text."""
    good = [torch.ones(3), torch.ones(4, dtype=torch.float64)]
    with pytest.raises(bitexact.DTypeError) as info:
        bitexact.total_norm(good + [torch.ones(2, dtype=torch.int32)])
    e = info.value
    assert (e.status, e.rank, e.group, e.tensor) == (2, -1, 0, 2)
    assert (e.other_group, e.other_tensor) == (-1, -1)
    assert "tensors[2]" in str(e) and _no_position_left(str(e))
    # groups: the position is the group's, the name the caller's
    labels = ["a", "b", "a", "b"]
    ts = [torch.ones(2), torch.ones(2), torch.ones(2), torch.ones(2, dtype=torch.int64)]
    with pytest.raises(bitexact.DTypeError) as info:
        bitexact.total_norm(ts, groups=labels)
    assert (info.value.group, info.value.tensor) == (1, 1)
    assert "tensors[3]" in str(info.value) and _no_position_left(str(info.value))
    # two digits: tensor 1 is not tensor 11
    many = [torch.ones(2) for _ in range(11)] + [torch.ones(2, dtype=torch.int64)]
    with pytest.raises(bitexact.DTypeError, match=r"tensors\[11\]") as info:
        bitexact.total_norm(many)
    assert info.value.tensor == 11 and "tensors[1]1" not in str(info.value)
    # bx_scale numbers the flat list: group -1
    with pytest.raises(bitexact.DTypeError) as info:
        bitexact.scale([torch.ones(2), torch.ones(2, dtype=torch.int32)], 0.5)
    assert (info.value.group, info.value.tensor) == (-1, 1)
    assert "tensors[1]" in str(info.value)
    # the binding's own errors are located too
    with pytest.raises(bitexact.DTypeError) as info:
        bitexact.total_norm([torch.ones(2), "x"])
    assert (info.value.group, info.value.tensor) == (0, 1)
    assert "tensors[1]" in str(info.value)


def test_overlap_names_both_tensors():
    """Tensors sharing memory in a clip or a scale: the library's one check
    names both; the exception locates both (tensor, other_tensor), and the
    message names both of the caller's tensors, whatever their positions."""
    base = torch.arange(12, dtype=torch.float32)
    snap = base.clone()
    cases = [([base[:4], torch.ones(3), base[3:6]], {0, 2}),
             ([torch.ones(3), base[5:], base[:6]], {1, 2}),
             ([base, torch.ones(2), torch.ones(2), base[11:]], {0, 3})]
    for ts, pair in cases:
        for call in (lambda: bitexact.scale(ts, 0.5), lambda: bitexact.clip_grad_norm(ts, 1e-3)):
            with pytest.raises(bitexact.LayoutError) as info:
                call()
            e = info.value
            assert {e.tensor, e.other_tensor} == pair, (str(e), e.tensor, e.other_tensor)
            a, b = sorted(pair)
            assert f"tensors[{a}]" in str(e) and f"tensors[{b}]" in str(e), str(e)
            assert "share memory" in str(e) and _no_position_left(str(e))
            assert same_bits(base, snap)
    # an unowned tensor over an owned one: each named as the caller passed it
    with pytest.raises(bitexact.LayoutError, match=r"tensors\[1\].*unowned\[0\]|"
                                                   r"unowned\[0\].*tensors\[1\]") as info:
        bitexact.clip_grad_norm([torch.ones(3), base[:5]], 1e-3, unowned=[base[4:8]])
    assert same_bits(base, snap)
    # parameters by their position in `parameters`
    ps = params_with_grads([torch.ones(3), torch.ones(2)])
    ps.append(torch.nn.Parameter(torch.zeros(2)))
    ps[2].grad = ps[0].grad[1:]
    with pytest.raises(bitexact.LayoutError, match=r"parameters\[0\] and parameters\[2\] "
                                                   "share memory"):
        bt.clip_grad_norm_(ps, 1e-3)


def test_p0_counts_nonfinite_and_does_not_raise():
    """p = 0 counts NaN and Inf as non-zero (as torch does), so the count is
    finite and error_if_nonfinite never raises for it (torch's rule: it
    raises on a non-finite total); p = -inf raises only when the smallest
    |x| is NaN or Inf."""
    nan, inf = math.nan, math.inf
    g = [torch.tensor([0.0, nan, 1.0, -inf]), torch.tensor([inf, 0.0, -2.0], dtype=torch.float64)]
    assert bitexact.total_norm(g, 0.0) == 5.0
    assert bitexact.total_norm(g, 0.0, error_if_nonfinite=True) == 5.0
    t = bt.get_total_norm(g, 0.0, error_if_nonfinite=True)
    assert t.dtype == torch.float64 and float(t) == 5.0
    a = params_with_grads(g)
    assert float(bt.clip_grad_norm_(a, 1.0, 0.0, error_if_nonfinite=True)) == 5.0
    b = params_with_grads(g)
    torch.nn.utils.clip_grads_with_norm_(b, 1.0, torch.tensor(5.0, dtype=torch.float64))
    for p, q in zip(a, b):
        assert torch.equal(torch.isnan(p.grad), torch.isnan(q.grad))
        assert torch.equal(p.grad.nan_to_num(7.0), q.grad.nan_to_num(7.0))
    # torch agrees that this is no error
    torch.nn.utils.get_total_norm(g, 0.0, error_if_nonfinite=True)
    # -inf: min |x| = 0.5 with an Inf among finite values
    h = [torch.tensor([3.0, inf, 0.5]), torch.tensor([-inf, -2.0])]
    assert bitexact.total_norm(h, -inf, error_if_nonfinite=True) == 0.5
    assert float(bt.clip_grad_norm_(params_with_grads(h), 1.0, -inf,
                                    error_if_nonfinite=True)) == 0.5
    assert float(torch.nn.utils.get_total_norm(h, -inf, error_if_nonfinite=True)) == 0.5
    with pytest.raises(bitexact.NonFiniteError):
        bitexact.total_norm([torch.tensor([inf, -inf])], -inf, error_if_nonfinite=True)
    with pytest.raises(bitexact.NonFiniteError, match=r"tensors\[1\]"):
        bitexact.total_norm([torch.ones(2), torch.tensor([nan])], -inf, error_if_nonfinite=True)
    # p = inf and p = 2 with an Inf still raise, naming the tensor
    for p in (math.inf, 2.0, 1.0):
        with pytest.raises(bitexact.NonFiniteError, match=r"tensors\[0\] holds an infinite"):
            bitexact.total_norm(h, p, error_if_nonfinite=True)
