"""The framework-neutral API: any DLPack producer, the same bits through
NumPy, torch and the C API; capsule ownership; groups; Python comms."""
import ctypes
import os
import struct
import threading

import numpy as np
import pytest
import torch

import bitexact
import bitexact.torch as bt
from dlpack_ctypes import KDLBFLOAT, Producer, c_total_norm, capsule_name
from exact_ref import exact_norm
from helpers import random_tensors, same_bits

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _c_libraries():
    libs = [("extension", bitexact._core.__file__)]
    make_lib = os.path.join(ROOT, "build", "libbitexact.so")  # `make lib`, if built
    libs.append(("make", make_lib))
    return libs


@pytest.mark.parametrize("which,path", _c_libraries(), ids=lambda x: x if "/" not in x else "")
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
def test_numpy_torch_capi_identical(which, path, dtype):
    if not os.path.exists(path):
        pytest.skip(f"{path} not built (run `make lib`)")
    grads = random_tensors(31, [dtype], count=9)
    via_torch = bitexact.total_norm(grads)
    lib = ctypes.CDLL(path)
    st, via_c = c_total_norm(lib, grads)
    assert st == 0
    assert struct.pack("<d", via_c) == struct.pack("<d", via_torch)
    assert via_torch == exact_norm(grads, "float64")
    if dtype != "bfloat16":  # NumPy has no bfloat16
        arrays = [g.numpy() for g in grads]
        # views of the torch tensors' memory, not copies: the same elements
        assert all(not a.flags.owndata and a.ctypes.data == g.data_ptr()
                   for a, g in zip(arrays, grads))
        via_numpy = bitexact.total_norm(arrays)
        assert struct.pack("<d", via_numpy) == struct.pack("<d", via_torch)
        # and torch's result for NumPy-backed tensors is the same tensor bits
        assert same_bits(bt.get_total_norm([torch.from_numpy(a) for a in arrays]),
                         bt.get_total_norm(grads))


def test_numpy_in_place_no_copy():
    a = np.full(1000, 3.0, dtype=np.float32)
    b = np.full(10, 4.0, dtype=np.float64)
    total = bitexact.clip_grad_norm([a, b], 1.0)
    assert total == float(np.sqrt(np.float64(9 * 1000 + 16 * 10)))
    coef = bitexact.clip_coef(total, 1.0)
    assert a[0] == np.float32(np.float32(3.0) * np.float32(coef))  # torch mode, in place
    assert b[0] == 4.0 * coef


def test_capsules_are_consumed_and_deleted():
    t = torch.arange(12, dtype=torch.float32)
    for versioned in (False, True):
        p = Producer(t, versioned=versioned)
        assert bitexact.total_norm([p]) == exact_norm([t])
        assert p.deleted == 1
        assert capsule_name(p.capsules[-1]).startswith("used_dltensor")
    # a raw capsule is accepted and consumed
    cap = t.__dlpack__()
    assert bitexact.total_norm([cap]) == exact_norm([t])
    assert capsule_name(cap) == "used_dltensor"
    with pytest.raises(bitexact.InvalidArgumentError, match="capsule"):
        bitexact.total_norm([cap])  # a capsule can be consumed once


def test_deleters_run_on_errors():
    good = Producer(torch.ones(4))
    # kDLOpenCL: a device no build reads (CUDA is test_cuda.py's)
    bad = Producer(torch.ones(4), device_type=4)
    with pytest.raises(bitexact.DeviceError, match=r"tensors\[1\].*device type 4"):
        bitexact.total_norm([good, bad])
    assert good.deleted == 1 and bad.deleted == 1
    with pytest.raises(ValueError):  # DeviceError is a ValueError
        bitexact.clip_grad_norm([bad], 1.0)


def test_bfloat16_through_hand_made_capsule():
    t = torch.randn(100).to(torch.bfloat16)
    p = Producer(t, dtype=(KDLBFLOAT, 16))
    assert bitexact.total_norm([p]) == exact_norm([t])


def test_read_only_and_copied_exports_are_not_scaled():
    t = torch.ones(8)
    ro = Producer(t, versioned=True, flags=1)
    assert bitexact.total_norm([ro]) == exact_norm([t])  # reading is fine
    with pytest.raises(bitexact.InvalidArgumentError, match="read-only"):
        bitexact.clip_grad_norm([ro], 0.5)
    assert torch.all(t == 1)
    cp = Producer(t, versioned=True, flags=2)
    with pytest.raises(ValueError, match="copy"):
        bitexact.scale([cp], 0.5)
    assert torch.all(t == 1)
    # NumPy exports a read-only array with the versioned read-only flag
    a = np.ones(5)
    a.setflags(write=False)
    assert bitexact.total_norm([a]) == exact_norm([a])
    with pytest.raises(ValueError, match="read-only"):
        bitexact.clip_grad_norm([np.ones(3), a], 0.5)


class LegacyProducer:
    """A pre-DLPack-1.0 producer: __dlpack__ takes no max_version."""

    def __init__(self, arr):
        self.arr = arr

    def __dlpack__(self, stream=None):
        return self.arr.__dlpack__()


def test_legacy_producer():
    a = np.linspace(-3, 7, 101)
    assert bitexact.total_norm([LegacyProducer(a)]) == exact_norm([a])
    assert bitexact.total_norm([LegacyProducer(a)] * 2) == exact_norm([a, a])


def test_groups_and_unowned():
    g = random_tensors(41, ["float32", "float64"], count=6)
    labels = ["dense", "expert", "dense", "dense", "expert", "dense"]
    total, per = bitexact.total_norm(g, groups=labels)
    assert total == exact_norm(g)
    assert per["dense"] == exact_norm([t for t, l in zip(g, labels) if l == "dense"])
    assert per["expert"] == exact_norm([t for t, l in zip(g, labels) if l == "expert"])
    # clip with unowned replicas: counted once, all scaled
    a = [t.clone() for t in g]
    extra = [t.clone() for t in g[:2]]
    total2 = bitexact.clip_grad_norm(a, 1e-3, unowned=extra)
    assert total2 == total
    b = [t.clone() for t in g]
    bitexact.clip_grad_norm(b, 1e-3)
    assert all(same_bits(x, y) for x, y in zip(a, b))
    assert all(same_bits(x, y) for x, y in zip(extra, b[:2]))
    with pytest.raises(ValueError):
        bitexact.total_norm(g, groups=labels[:3])


def _threaded_ranks(nranks, fn):
    """Run fn(rank, comm) on nranks threads with an in-process all-reduce."""
    barrier = threading.Barrier(nranks)
    slots = [None] * nranks
    results = [None] * nranks

    def make_comm(rank):
        def allreduce(buf, op):
            words = np.frombuffer(buf, dtype=np.int64)
            slots[rank] = words.copy()
            barrier.wait()
            stack = np.stack(slots)
            red = stack.sum(axis=0) if op == "sum" else stack.max(axis=0)
            barrier.wait()
            words[:] = red
        return bitexact.Comm(allreduce, rank)

    def run(rank):
        try:
            results[rank] = fn(rank, make_comm(rank))
        except bitexact.Error as e:  # after the collectives: the others finish too
            results[rank] = e
        except BaseException as e:  # noqa: BLE001 - reported below
            results[rank] = e
            barrier.abort()  # do not leave the other ranks waiting

    threads = [threading.Thread(target=run, args=(r,)) for r in range(nranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


@pytest.mark.parametrize("nranks", [2, 4])
def test_python_comm_on_threads(nranks):
    """A Python all-reduce called from C with the GIL released: several
    'ranks' on threads of one process get the unsharded bits."""
    g = random_tensors(51, ["float32", "bfloat16", "float16"], count=10)
    pieces = [p for t in g for p in t.flatten().split(777)]
    ref = bitexact.total_norm(g)
    res = _threaded_ranks(nranks, lambda r, c: bitexact.total_norm(pieces[r::nranks], comm=c))
    assert res == [ref] * nranks
    # clipping: each rank clips its pieces; the union equals one-process clip
    mine = [[p.clone() for p in pieces[r::nranks]] for r in range(nranks)]
    res = _threaded_ranks(nranks, lambda r, c: bitexact.clip_grad_norm(mine[r], 1e-2, comm=c))
    assert res == [ref] * nranks
    whole = [p.clone() for p in pieces]
    bitexact.clip_grad_norm(whole, 1e-2)
    for r in range(nranks):
        assert all(same_bits(x, y) for x, y in zip(mine[r], whole[r::nranks]))


def test_comm_exception_becomes_comm_error():
    def broken(buf, op):
        raise ConnectionError("link down")
    with pytest.raises(bitexact.CommError) as info:
        bitexact.total_norm([np.ones(3)], comm=bitexact.Comm(broken, 3))
    assert isinstance(info.value.__cause__, ConnectionError)
    assert "rank 3" in str(info.value)


def test_mismatched_options_fail_on_every_rank():
    g = [np.ones(4)]
    res = _threaded_ranks(2, lambda r, c: bitexact.total_norm(g, norm_type=2.0 if r else 1.0,
                                                              comm=c))
    assert all(isinstance(e, bitexact.MismatchError) for e in res), res


def test_grads_dtype_agreed_across_ranks():
    """norm_dtype="grads": torch's promotion of the dtypes of every rank's
    tensors (bf16 on one rank, fp16 on the other: fp32), agreed in the
    agreement step, the same bits on every rank; a rank holding nothing
    takes the others' dtype."""
    g = random_tensors(53, ["bfloat16", "float16"], count=8)
    bf, f16 = g[0::2], g[1::2]
    want = exact_norm(g, "float32")
    res = _threaded_ranks(2, lambda r, c: bitexact.total_norm([bf, f16][r], comm=c,
                                                              norm_dtype="grads"))
    assert res == [want, want]
    assert bitexact.total_norm(bf, norm_dtype="grads") == exact_norm(bf, "bfloat16")
    res = _threaded_ranks(3, lambda r, c: bitexact.total_norm([bf, [], bf][r], comm=c,
                                                              norm_dtype="grads"))
    assert res == [exact_norm(bf + bf, "bfloat16")] * 3
