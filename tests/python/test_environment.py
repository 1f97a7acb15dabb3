"""What the caller's process does cannot change a result: its floating-point
modes (torch.set_flush_denormal), fork(), and calls made from inside a
Comm's all-reduce (re-entry). Every comparison is of bit patterns."""
import hashlib
import math
import multiprocessing
import os
import queue
import select
import signal
import struct

import numpy as np
import pytest
import torch

import bitexact
import bitexact.torch as bt
from exact_ref import exact_norm
from helpers import bits, params_with_grads

NORM_TYPES = [2.0, 1.0, math.inf, -math.inf, 0.0, 3.0]
THREADS = [1, 2, 4]
SCALE_MODES = ["torch", "exact"]

# ---- torch.set_flush_denormal(True) ----------------------------------------

TINY = {torch.float32: 2.0 ** -126, torch.bfloat16: 2.0 ** -126, torch.float16: 2.0 ** -14,
        torch.float64: 2.0 ** -1022}  # the smallest normal number of each dtype


def _subnormal_sets():
    """Gradients made of their dtype's subnormals (plus, in "mix", a few
    normal numbers and zeros), built while flush-to-zero is off. "mix" is
    large enough (over 3 * 2^16 elements) to start 4 worker threads."""
    g = torch.Generator().manual_seed(17)

    def below(n, dtype):  # uniform in (-tiny, tiny): subnormal (or zero) in dtype
        u = torch.rand(n, generator=g, dtype=torch.float64) * 2 - 1
        return (u * (0.99 * TINY[dtype])).to(dtype)
    f32, f64 = below(120000, torch.float32), below(30000, torch.float64)
    bf16, f16 = below(30000, torch.bfloat16), below(30000, torch.float16)
    for t in (f32, f64, bf16, f16):
        assert bool((t.double().abs() < TINY[t.dtype]).all())
        assert int((t != 0).sum()) > 0.99 * t.numel()
    normal = torch.tensor([0.0, 1.5, -2.0 ** -20, 0.0], dtype=torch.float32)
    return {"f32": [f32[:1000], f32[1000:20000]], "f64": [f64], "bf16": [bf16], "f16": [f16],
            "mix": [f32, f64, normal, bf16, f16]}


def _f64(x):
    return struct.pack("<d", x)  # a byte copy: no arithmetic


def _tbits(t):
    return bits(t).numpy().tobytes()


def _all_bits(ts):
    return tuple(_tbits(t) for t in ts)


def _max_norms(sets):
    """max_norm per (set, p, flavor) so that the coefficient is about 0.37
    (the scaled subnormals stay subnormal); computed with flushing off."""
    out = {}
    for name, ts in sets.items():
        for p in NORM_TYPES:
            for fl in (["exact", "megatron_fp32"] if p == 2.0 else ["exact"]):
                n = bitexact.total_norm(ts, p, flavor=fl)
                out[name, p, fl] = 0.37 * (n + 1e-6) if math.isfinite(n) else 1.0
    return out


def _every_result(sets, max_norms):
    """Every public function on every set, for every p, flavour, scale mode
    and thread count: {case: bits}."""
    out = {}
    for name, ts in sets.items():
        for p in NORM_TYPES:
            for fl in (["exact", "megatron_fp32"] if p == 2.0 else ["exact"]):
                mn = max_norms[name, p, fl]
                for th in THREADS:
                    key = (name, p, fl, th)
                    out[key + ("total_norm",)] = _f64(
                        bitexact.total_norm(ts, p, num_threads=th, flavor=fl))
                    out[key + ("get_total_norm",)] = _tbits(
                        bt.get_total_norm(ts, p, num_threads=th, flavor=fl))
                    for mode in SCALE_MODES:
                        a = [t.clone() for t in ts]
                        total = bitexact.clip_grad_norm(a, mn, p, num_threads=th, flavor=fl,
                                                        scale_mode=mode)
                        out[key + ("clip_grad_norm", mode)] = (_f64(total), _all_bits(a))
                        ps = params_with_grads(ts)
                        total = bt.clip_grad_norm_(ps, mn, p, scale_mode=mode, num_threads=th,
                                                   flavor=fl)
                        out[key + ("clip_grad_norm_", mode)] = (
                            _tbits(total), _all_bits(q.grad for q in ps))
        for th in THREADS:
            for mode in SCALE_MODES:
                a = [t.clone() for t in ts]
                bitexact.scale(a, 0.37, mode=mode, num_threads=th)
                out[name, th, "scale", mode] = _all_bits(a)
                ps = params_with_grads(ts)
                bt.clip_grads_with_norm_(ps, 0.37, torch.tensor(1.0), scale_mode=mode,
                                         num_threads=th)
                out[name, th, "clip_grads_with_norm_", mode] = _all_bits(q.grad for q in ps)
    return out


def _probe():
    """An fp32 subnormal through torch: 0.0 while flush-to-zero is on."""
    return (torch.tensor([1e-40], dtype=torch.float32) * 1.0).item()


def test_flush_denormal_changes_nothing():
    """With torch.set_flush_denormal(True) (FTZ and DAZ on this thread) every
    public function gives the bits it gives without, on data made of
    subnormals, and torch's setting is still on afterwards."""
    assert _probe() != 0.0
    sets = _subnormal_sets()
    max_norms = _max_norms(sets)
    want = _every_result(sets, max_norms)
    # the cases do see the subnormals: nothing here is all zeros
    assert bitexact.total_norm(sets["f32"], math.inf) > 0
    assert bitexact.total_norm(sets["f64"], 2.0) > 0
    assert bitexact.total_norm(sets["f16"], 0.0) > 0.99 * 30000
    if not torch.set_flush_denormal(True):
        pytest.skip("torch.set_flush_denormal is not supported on this CPU")
    try:
        assert _probe() == 0.0  # flushing is on
        got = _every_result(sets, max_norms)
        still_on = _probe()
    finally:
        torch.set_flush_denormal(False)
    assert still_on == 0.0, "a bitexact call left torch's flush-to-zero mode off"
    assert _probe() != 0.0
    assert got.keys() == want.keys()
    differ = [k for k in want if got[k] != want[k]]
    assert not differ, f"{len(differ)} of {len(want)} results differ under flush-to-zero, " \
                       f"e.g. {differ[:5]}"


# ---- fork() ----------------------------------------------------------------

def _fork_data():
    rng = np.random.default_rng(3)  # enough elements for 4 worker threads
    return [rng.standard_normal(300000).astype(np.float32), rng.standard_normal(100000)]


def _threaded_calls(data):
    """A norm and a clip on 4 threads: their bits, as bytes."""
    total = bitexact.total_norm(data, num_threads=4)
    a = [x.copy() for x in data]
    clipped = bitexact.clip_grad_norm(a, 0.5, num_threads=4)
    h = hashlib.sha256(b"".join(x.tobytes() for x in a)).digest()
    return _f64(total) + _f64(clipped) + h


def _wait_child(pid, fd, nbytes, timeout):
    """Read nbytes from fd within timeout seconds; kill the child if not."""
    got = b""
    try:
        while len(got) < nbytes:
            ready, _, _ = select.select([fd], [], [], timeout)
            if not ready:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                pytest.fail(f"the forked child did not answer within {timeout} s (a deadlock "
                            "in the library after fork?)")
            chunk = os.read(fd, nbytes - len(got))
            if not chunk:
                break
            got += chunk
    finally:
        os.close(fd)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"child status {status}"
    return got


def test_os_fork_after_threaded_call():
    data = _fork_data()
    want = _threaded_calls(data)  # the worker threads are running now
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the same calls, its bits to the parent
        code = 1
        try:
            os.close(r)
            os.write(w, _threaded_calls(data))
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    got = _wait_child(pid, r, len(want), timeout=60)
    assert got == want
    assert _threaded_calls(data) == want  # and the parent's workers still work


def _mp_child(data, q):
    q.put(_threaded_calls(data))


def test_multiprocessing_fork_after_threaded_call():
    data = _fork_data()
    want = _threaded_calls(data)
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_mp_child, args=(data, q))
    p.start()
    try:
        got = q.get(timeout=60)
    except queue.Empty:
        got = None
    finally:
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
            p.join()
    assert got is not None, "the fork-started child did not answer within 60 s (a deadlock?)"
    assert got == want
    assert p.exitcode == 0


# ---- re-entry from a Comm's all-reduce --------------------------------------

def test_norm_from_inside_a_comm_callback():
    """A Comm whose all-reduce computes another norm (a logging hook): both
    the inner and the outer calls give their own bits, multi-threaded."""
    rng = np.random.default_rng(8)
    outer = [rng.standard_normal(200000).astype(np.float32), rng.standard_normal(5000)]
    inner = [rng.standard_normal(300000).astype(np.float32) * 1e-3]
    want_outer = bitexact.total_norm(outer, num_threads=2)
    want_inner = bitexact.total_norm(inner, num_threads=4)
    want_inner_t = bt.get_total_norm([torch.from_numpy(inner[0])], 1.0, num_threads=4)
    assert want_inner == exact_norm(inner)
    seen = []

    def allreduce(buf, op):  # one rank: buf already holds the reduction
        seen.append((op, bitexact.total_norm(inner, num_threads=4),
                     _tbits(bt.get_total_norm([torch.from_numpy(inner[0])], 1.0,
                                              num_threads=4))))
    got = bitexact.total_norm(outer, comm=bitexact.Comm(allreduce), num_threads=2)
    assert _f64(got) == _f64(want_outer)
    assert seen == [(op, want_inner, _tbits(want_inner_t)) for op in ("max", "sum")]
    # a clip with an inner clip of other tensors
    a = [x.copy() for x in outer]
    b = [x.copy() for x in inner]
    ref_a, ref_b = [x.copy() for x in outer], [x.copy() for x in inner]
    ref_outer = bitexact.clip_grad_norm(ref_a, 0.5, num_threads=2)
    bitexact.clip_grad_norm(ref_b, 0.5, num_threads=4)
    calls = []

    def clip_inside(buf, op):
        if op == "sum":
            calls.append(bitexact.clip_grad_norm(b, 0.5, num_threads=4))
    assert _f64(bitexact.clip_grad_norm(a, 0.5, comm=bitexact.Comm(clip_inside),
                                        num_threads=2)) == _f64(ref_outer)
    assert calls == [want_inner]
    assert all(x.tobytes() == y.tobytes() for x, y in zip(a + b, ref_a + ref_b))


def test_nesting_limit():
    """Calls nest from callbacks up to 4 deep; the 5th raises
    InvalidArgumentError inside its callback, and the calls around it
    finish with their own results."""
    errors, results = [], []

    def comm_at(level):
        def allreduce(buf, op):
            if op != "max":
                return
            try:
                results.append((level + 1, bitexact.total_norm([np.full(9, 2.0)],
                                                               comm=comm_at(level + 1))))
            except bitexact.InvalidArgumentError as e:
                errors.append((level + 1, str(e)))
        return bitexact.Comm(allreduce)
    assert bitexact.total_norm([np.ones(4)], comm=comm_at(1)) == 2.0
    assert [lv for lv, _ in errors] == [5], errors
    assert "4" in errors[0][1] and "nested" in errors[0][1]
    assert sorted(results) == [(2, 6.0), (3, 6.0), (4, 6.0)]
