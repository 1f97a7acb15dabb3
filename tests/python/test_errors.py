"""Bad inputs: the documented exception, the parameter named, nothing
modified."""
import math
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
    add("complex", lambda: torch.ones(4, dtype=torch.complex64), TypeError, "not supported")
    add("bool", lambda: torch.ones(4, dtype=torch.bool), TypeError, "not supported")
    add("strided-gaps", lambda: torch.ones(4, 6)[:, ::2], ValueError, "gaps")
    add("column-slice", lambda: torch.ones(4, 6)[:, 1:3], bitexact.LayoutError, "contiguous")
    add("expanded", lambda: torch.ones(1, 5).expand(4, 5), ValueError, "stride")
    add("sparse", lambda: torch.ones(4).to_sparse(), ValueError, "DLPack")
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


@pytest.mark.parametrize("norm_type", [-1.0, math.nan, -0.5])
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
