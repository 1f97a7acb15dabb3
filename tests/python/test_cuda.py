"""CUDA tensors: the drop-ins against torch on the GPU and against bitexact's
own CPU results, stream semantics, CUDA graph capture, errors.

The GPU tests run only where torch sees a GPU and this build of bitexact
has the CUDA backend with a usable device; elsewhere they are skipped with
the reason (never counted as passed). The first tests need no GPU: what a
build without the backend, or without a device, says about CUDA tensors.
"""
import math
import time

import pytest
import torch

import bitexact
import bitexact.torch as bt
from dlpack_ctypes import KDLCUDA, Producer
from helpers import params_with_grads, random_tensors, same_bits

INFO = bitexact.cuda_info()
TORCH_GPU = torch.cuda.is_available()
GPU = TORCH_GPU and INFO["available"]
if not INFO["built"]:
    WHY = "this build of bitexact has no CUDA backend (nvcc was not found at install time)"
elif not INFO["available"]:
    WHY = f"bitexact's CUDA backend cannot run here: {INFO['reason']}"
elif not TORCH_GPU:
    WHY = "torch sees no CUDA device"
else:
    WHY = ""
needs_gpu = pytest.mark.skipif(not GPU, reason=WHY)

MIXES = [
    ["float32"], ["bfloat16"], ["float16"], ["float64"],
    ["float32", "bfloat16"], ["float16", "bfloat16"],
    ["float32", "float16", "bfloat16"], ["float64", "float32", "bfloat16", "float16"],
]


def cuda(ts):
    return [t.cuda() for t in ts]


def cuda_params(grads):
    ps = params_with_grads(grads)
    for p in ps:
        p.data = p.data.cuda()
        p.grad = p.grad.cuda()
    return ps


# ---- no GPU needed ---------------------------------------------------------

def test_cuda_info():
    assert set(INFO) == {"built", "available", "reason"}
    assert bitexact.cuda_available() == INFO["available"]
    if not INFO["built"]:
        assert not INFO["available"] and "no CUDA backend" in INFO["reason"]
    if not INFO["available"]:
        assert INFO["reason"]


@pytest.mark.skipif(INFO["available"], reason="a CUDA device is usable: the fake CUDA "
                    "tensor of this test (host memory) would be read by the GPU")
def test_cuda_tensor_without_backend_or_device():
    """No backend in the build, or no device: DeviceError naming the tensor
    and saying which, nothing read."""
    t = torch.ones(4)
    with pytest.raises(bitexact.DeviceError, match=r"tensors\[0\].*CUDA tensor") as e:
        bitexact.total_norm([Producer(t, device_type=KDLCUDA)])
    if not INFO["built"]:
        assert "this build of bitexact has no CUDA backend" in str(e.value)
    else:
        assert INFO["reason"] in str(e.value)
    with pytest.raises(ValueError):
        bitexact.clip_grad_norm([Producer(t, device_type=KDLCUDA)], 0.5)
    with pytest.raises(ValueError):
        bitexact.scale([Producer(t, device_type=KDLCUDA)], 0.5)
    assert torch.all(t == 1)


def test_mixed_host_and_cuda_refused_before_reading():
    """A CPU tensor and a (fake, never read) CUDA tensor in one call."""
    a, b = torch.ones(3), torch.full((4,), 2.0)
    with pytest.raises(bitexact.DeviceError, match=r"tensors\[1\]") as e:
        bitexact.clip_grad_norm([a, Producer(b, device_type=KDLCUDA)], 0.1)
    if INFO["built"]:
        assert "one call takes the tensors of one device" in str(e.value)
    assert torch.all(a == 1) and torch.all(b == 2)


def test_views_device_kind_and_plan_refusal():
    """Where a call's tensors live, read from the DLPack devices alone."""
    from bitexact import _core
    t = torch.ones(2)
    assert _core.Views([[]]).device == ("none", -1)
    assert _core.Views([[t, t]]).device == ("host", -1)
    assert _core.Views([[Producer(t, device_type=KDLCUDA)]]).device == ("cuda", 0)
    assert _core.Views([[t], [Producer(t, device_type=KDLCUDA)]]).device == ("mixed", 0)
    with pytest.raises(bitexact.DeviceError):
        _core.Views([[t]]).cuda_plan()  # CPU tensors have no CUDA plan
    if not INFO["available"]:  # never touches the (host) memory
        with pytest.raises(bitexact.DeviceError, match="group 0, tensor 0"):
            _core.Views([[Producer(t, device_type=KDLCUDA)]]).cuda_plan()


def test_plan_cache_settings():
    n, size = bitexact.cuda_plan_cache()
    assert 0 <= n <= size
    try:
        assert bitexact.cuda_plan_cache(size=3)[1] == 3
        assert bitexact.cuda_plan_cache(clear=True)[0] == 0
        with pytest.raises(ValueError):
            bitexact.cuda_plan_cache(size=-1)
    finally:
        bitexact.cuda_plan_cache(size=size)


class _Raw:
    """A tensor-like over another tensor's memory with arbitrary strides
    (for Producer): data_ptr(), shape, stride(), dtype."""

    def __init__(self, base, offset, shape, strides):
        self.base, self.shape, self.strides = base, tuple(shape), tuple(strides)
        self.ptr = base.data_ptr() + offset * base.element_size()
        self.dtype = base.dtype

    def data_ptr(self):
        return self.ptr

    def stride(self):
        return self.strides


def test_check_scale_targets():
    """The host-side check the stream-ordered scaling runs first (the
    per-dtype plans only see their own tensors), the library's one check
    (bx_check_writable): any two tensors sharing memory, LayoutError naming
    both in the text and as integers (group/tensor, other_group/
    other_tensor); disjoint pieces of one buffer pass, interleaved ones
    too; every tensor must be valid for writing (dtype; its own elements
    disjoint), overlapping another or not."""
    from bitexact import _core
    t = torch.zeros(12)
    with _core.Views([[t[:6], t[6:]], [torch.zeros(3), t[:0]]]) as v:
        v.check_scale_targets()
    # (groups, the pair as the text names it: lower address first)
    cases = [([[t, t]], ((0, 0), (0, 1))),
             ([[t[:7]], [torch.ones(2), t[6:]]], ((0, 0), (1, 1))),
             ([[t[2:3], torch.ones(1), t.view(torch.bfloat16)[:5]]], ((0, 2), (0, 0))),
             ([[t.view(3, 4).t(), t[11:]]], ((0, 0), (0, 1)))]
    for groups, (a, b) in cases:
        names = f"group {a[0]}, tensor {a[1]} and group {b[0]}, tensor {b[1]}"
        with _core.Views(groups) as v:
            with pytest.raises(bitexact.LayoutError, match=names + " share memory") as e:
                v.check_scale_targets()
        where = {(e.value.group, e.value.tensor), (e.value.other_group, e.value.other_tensor)}
        assert where == {a, b}, (names, where)
    # host tensors may have any strides (bitexact.h "Layouts"): a view
    # with gaps, and negative strides disjoint from another tensor, pass
    with _core.Views([[torch.ones(1), t[::2]], [t[1::2]]]) as v:
        v.check_scale_targets()
    with _core.Views([[t[6:], Producer(_Raw(t, 5, [6], [-1]))]]) as v:
        v.check_scale_targets()
    # negative strides (t[5], t[4], ..., t[0]) sharing t[5] with t[5:]: both named
    with _core.Views([[t[5:], Producer(_Raw(t, 5, [6], [-1]))]]) as v:
        with pytest.raises(bitexact.LayoutError, match="share memory") as e:
            v.check_scale_targets()
    assert {(e.value.group, e.value.tensor), (e.value.other_group, e.value.other_tensor)} == {
        (0, 0), (0, 1)}
    # one tensor's own dtype, or its own elements overlapping (expanded):
    # refused alone, no second tensor
    for groups, exc, at, text in [
            ([[t.view(torch.int32)[2:3], torch.ones(1)]], bitexact.DTypeError, (0, 0), "int32"),
            ([[torch.ones(1), t[:3].expand(2, 3)]], bitexact.LayoutError, (0, 1), "expanded view")]:
        with _core.Views(groups) as v:
            with pytest.raises(exc, match=f"group {at[0]}, tensor {at[1]}: .*{text}") as e:
                v.check_scale_targets()
        assert (e.value.group, e.value.tensor) == at
        assert (e.value.other_group, e.value.other_tensor) == (-1, -1)


@pytest.mark.skipif(INFO["available"], reason="a CUDA device is usable: the fake CUDA "
                    "tensors of this test (host memory) must not reach it; the GPU tests "
                    "check the same on real ones")
def test_cuda_scaling_refuses_shared_memory_before_any_cuda_call():
    """bitexact.torch's stream-ordered scaling checks the whole call before
    it asks torch or the library for anything: tensors sharing memory give
    LayoutError naming both, nothing is touched (fake CUDA tensors here)."""
    from bitexact import _core
    t = torch.full((8,), 2.0)
    with _core.Views([[Producer(t[:5], device_type=KDLCUDA), torch.ones(1),
                       Producer(t[4:], device_type=KDLCUDA)]]) as v:
        with pytest.raises(bitexact.LayoutError, match="tensor 0 and group 0, tensor 2"):
            bt._cuda_scale(v, torch.tensor(0.5), 0, None, torch.device("cuda", 0))
    assert torch.all(t == 2)


# ---- on the GPU ------------------------------------------------------------

@needs_gpu
@pytest.mark.parametrize("mix", MIXES, ids=lambda m: "+".join(m))
@pytest.mark.parametrize("seed", [0, 1])
def test_norm_equals_cpu_and_close_to_torch(mix, seed):
    grads = random_tensors(seed, mix)
    ours = bt.get_total_norm(cuda(grads))
    theirs = torch.nn.utils.get_total_norm(cuda(grads))
    assert ours.device.type == "cuda" and ours.shape == ()
    assert ours.dtype == theirs.dtype
    cpu = bt.get_total_norm(grads)
    assert same_bits(ours.cpu(), cpu), f"seed {seed}: GPU {float(ours)!r} != CPU {float(cpu)!r}"
    p = min({torch.float64: 53, torch.float32: 24, torch.bfloat16: 8,
             torch.float16: 11}[g.dtype] for g in grads)
    assert abs(float(theirs) - float(cpu)) <= (4 * 2.0 ** -p + 1e-6) * float(cpu)
    # the neutral API (blocking, fp64) agrees with the CPU's too
    assert bitexact.total_norm(cuda(grads)) == bitexact.total_norm(grads)


@needs_gpu
@pytest.mark.parametrize("norm_type", [1.0, math.inf, 0.0, -math.inf])
@pytest.mark.parametrize("mix", [["float32"], ["float32", "bfloat16"], ["float64"],
                                 ["bfloat16"], ["float16"]],
                         ids=lambda m: "+".join(m))
def test_other_norms_equal_cpu(norm_type, mix):
    grads = random_tensors(7, mix, count=6)
    assert same_bits(bt.get_total_norm(cuda(grads), norm_type).cpu(),
                     bt.get_total_norm(grads, norm_type))


@needs_gpu
@pytest.mark.parametrize("mix", MIXES, ids=lambda m: "+".join(m))
@pytest.mark.parametrize("active", [True, False], ids=["clipping", "no-clipping"])
def test_clip_bitwise_torch(mix, active):
    """With the same norm tensor, the scaled gradients are torch's CUDA
    clip_grads_with_norm_ bit for bit (its _foreach_mul_ converts the
    coefficient to each grad dtype first)."""
    grads = random_tensors(11, mix)
    norm = bitexact.total_norm(grads)
    max_norm = norm * (0.37 if active else 3.0)
    a, b = cuda_params(grads), cuda_params(grads)
    total = bt.clip_grad_norm_(a, max_norm)
    assert same_bits(total.cpu(), bt.get_total_norm(grads))
    torch.nn.utils.clip_grads_with_norm_(b, max_norm, total)
    for k, (p, q) in enumerate(zip(a, b)):
        assert same_bits(p.grad, q.grad), f"tensor {k} ({p.grad.dtype}) differs"
    # bitexact's clip_grads_with_norm_ with torch's norm tensor
    c, d = cuda_params(grads), cuda_params(grads)
    tn = torch.nn.utils.get_total_norm([p.grad for p in c])
    bt.clip_grads_with_norm_(c, max_norm, tn)
    torch.nn.utils.clip_grads_with_norm_(d, max_norm, tn)
    for k, (p, q) in enumerate(zip(c, d)):
        assert same_bits(p.grad, q.grad), f"clip_grads_with_norm_: tensor {k} differs"
    # and the version counters move as torch's
    assert [p.grad._version for p in a] == [q.grad._version for q in b]


@needs_gpu
@pytest.mark.parametrize("mix", [["float32", "float16", "bfloat16"], ["float64", "bfloat16"]],
                         ids=lambda m: "+".join(m))
def test_exact_scale_mode_equals_cpu(mix):
    grads = random_tensors(5, mix, count=6)
    max_norm = bitexact.total_norm(grads) * 0.3
    a, b = cuda_params(grads), params_with_grads(grads)
    ta = bt.clip_grad_norm_(a, max_norm, scale_mode="exact")
    tb = bt.clip_grad_norm_(b, max_norm, scale_mode="exact")
    assert same_bits(ta.cpu(), tb)
    for k, (p, q) in enumerate(zip(a, b)):
        assert same_bits(p.grad.cpu(), q.grad), f"tensor {k} ({q.grad.dtype}) differs"


@needs_gpu
def test_many_small_tensors():
    g = torch.Generator().manual_seed(5)
    dts = [torch.float32, torch.bfloat16, torch.float16]
    grads = [torch.randn(int(torch.randint(1, 70, (1,), generator=g)), generator=g)
             .to(dts[k % 3]) for k in range(3000)]
    ours = bt.get_total_norm(cuda(grads))
    assert same_bits(ours.cpu(), bt.get_total_norm(grads))
    a, b = cuda_params(grads), cuda_params(grads)
    total = bt.clip_grad_norm_(a, 0.5)
    torch.nn.utils.clip_grads_with_norm_(b, 0.5, total)
    assert all(same_bits(p.grad, q.grad) for p, q in zip(a, b))
    # again on the same buffers (the cached plans): the clipped values' norm
    clipped = [p.grad.cpu() for p in a]
    assert same_bits(bt.get_total_norm([p.grad for p in a]).cpu(), bt.get_total_norm(clipped))


def _sleep_seconds(cycles):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1000.0


@needs_gpu
def test_current_stream_order_and_no_host_wait():
    """On a side stream: bitexact reads what the stream wrote just before
    (it is enqueued on torch's current stream), and returns while the GPU
    is still busy (the host never waits)."""
    grads = random_tensors(3, ["float32", "bfloat16"], count=8)
    new = [t * 3 for t in grads]
    ps, new_on_gpu = cuda_params(grads), cuda(new)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    cycles = 200_000_000
    busy = _sleep_seconds(cycles)
    with torch.cuda.stream(s):
        bt.clip_grad_norm_(ps, 1e30)  # warm-up: builds and caches the plans
        torch.cuda._sleep(cycles)     # the GPU is busy for `busy` seconds
        for p, t in zip(ps, new_on_gpu):
            p.grad.copy_(t)           # device to device: enqueued behind the sleep
        t0 = time.perf_counter()
        total = bt.clip_grad_norm_(ps, 0.25)
        elapsed = time.perf_counter() - t0
    assert elapsed < busy / 2, f"the call waited for the GPU ({elapsed:.3f} s, busy {busy:.3f} s)"
    s.synchronize()
    assert same_bits(total.cpu(), bt.get_total_norm(new))
    ref = params_with_grads(new)
    torch.nn.utils.clip_grads_with_norm_(ref, 0.25, total.cpu())
    for p, q in zip(ps, ref):
        assert same_bits(p.grad.cpu(), q.grad)


@needs_gpu
def test_cuda_graph_capture():
    """clip_grad_norm_ captured in a CUDA graph after one warm-up call; each
    replay clips the values then in the gradient buffers."""
    grads = random_tensors(13, ["float32", "bfloat16"], count=6)
    ps = cuda_params(grads)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up on a side stream, as torch.cuda.graph asks
        bt.clip_grad_norm_(ps, 0.5)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        total = bt.clip_grad_norm_(ps, 0.5)
    for seed in (21, 22):
        gen = torch.Generator().manual_seed(seed)
        values = [(torch.randn(g.shape, generator=gen, dtype=torch.float64) * 2.0 ** (seed - 20))
                  .to(g.dtype) for g in grads]
        for p, v in zip(ps, values):
            p.grad.copy_(v)
        graph.replay()
        torch.cuda.synchronize()
        assert same_bits(total.cpu(), bt.get_total_norm(values)), f"replay {seed}"
        ref = params_with_grads(values)
        torch.nn.utils.clip_grads_with_norm_(ref, 0.5, total.cpu())
        for k, (p, q) in enumerate(zip(ps, ref)):
            assert same_bits(p.grad.cpu(), q.grad), f"replay {seed}, tensor {k}"


@needs_gpu
def test_plan_cache_eviction_keeps_results():
    n, size = bitexact.cuda_plan_cache()
    try:
        bitexact.cuda_plan_cache(size=1, clear=True)
        sets = [random_tensors(s, ["float32", "float16"], count=4) for s in (31, 32)]
        refs = [bt.get_total_norm(g) for g in sets]
        on_gpu = [cuda(g) for g in sets]
        for _ in range(3):  # alternate: every call evicts the other set's plan
            for g, r in zip(on_gpu, refs):
                assert same_bits(bt.get_total_norm(g).cpu(), r)
        assert bitexact.cuda_plan_cache()[0] <= 1
    finally:
        bitexact.cuda_plan_cache(size=size)


@needs_gpu
def test_error_if_nonfinite_names_parameter_and_modifies_nothing():
    for bad in (float("nan"), float("inf")):
        grads = random_tensors(9, ["float32", "bfloat16"], count=5)
        grads[2].view(-1)[3] = bad
        ps = cuda_params(grads)
        snap = [p.grad.clone() for p in ps]
        with pytest.raises(bitexact.NonFiniteError, match=r"parameters\[2\]"):
            bt.clip_grad_norm_(ps, 1e-3, error_if_nonfinite=True)
        assert all(same_bits(p.grad, q) for p, q in zip(ps, snap))
        with pytest.raises(RuntimeError):  # torch raises too
            torch.nn.utils.clip_grad_norm_(cuda_params(grads), 1e-3, error_if_nonfinite=True)
        with pytest.raises(bitexact.NonFiniteError, match=r"tensors\[2\]"):
            bt.get_total_norm([p.grad for p in ps], error_if_nonfinite=True)


@needs_gpu
def test_nonfinite_without_error_matches_torch():
    for bad in (float("nan"), float("inf")):
        g = [torch.tensor([1.0, bad]), torch.tensor([2.0, 3.0]),
             torch.tensor([0.5, -4.0]).to(torch.bfloat16)]
        a, b = cuda_params(g), cuda_params(g)
        ta = bt.clip_grad_norm_(a, 1.0)
        tb = torch.nn.utils.clip_grad_norm_(b, 1.0)
        assert same_bits(torch.isnan(ta), torch.isnan(tb))
        assert math.isnan(float(ta)) or float(ta) == float(tb) == math.inf
        for p, q in zip(a, b):  # NaN where torch has NaN (payloads may differ)
            assert torch.equal(torch.isnan(p.grad), torch.isnan(q.grad))
            assert same_bits(p.grad.nan_to_num(7.0), q.grad.nan_to_num(7.0))


@needs_gpu
def test_mixed_cpu_and_cuda_grads_refused():
    grads = random_tensors(4, ["float32"], count=3)
    ps = params_with_grads(grads)
    ps[1].data, ps[1].grad = ps[1].data.cuda(), ps[1].grad.cuda()
    snap = [p.grad.clone() for p in ps]
    with pytest.raises(bitexact.DeviceError, match=r"parameters\[1\] is on cuda:\d"):
        bt.clip_grad_norm_(ps, 1e-3)
    with pytest.raises(ValueError, match="one device"):
        bt.get_total_norm([p.grad for p in ps])
    assert all(same_bits(p.grad, s) for p, s in zip(ps, snap))


@needs_gpu
def test_neutral_api_on_cuda_blocking():
    """bitexact.total_norm / clip_grad_norm / scale on CUDA tensors (the
    blocking path, legacy default stream): the CPU's results, also when
    torch's current stream is another one."""
    grads = random_tensors(17, ["float32", "bfloat16", "float16"], count=6)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        g = [t.cuda() * 1 for t in grads]  # written on s
        assert bitexact.total_norm(g) == bitexact.total_norm(grads)
        total, per = bitexact.total_norm(g, groups=[k % 2 for k in range(6)])
        assert (total, per) == bitexact.total_norm(grads, groups=[k % 2 for k in range(6)])
        c = [t.clone() for t in grads]
        bitexact.clip_grad_norm(g, 0.01)
        bitexact.clip_grad_norm(c, 0.01)
        assert all(same_bits(x.cpu(), y) for x, y in zip(g, c))
        bitexact.scale(g, 0.75)
        bitexact.scale(c, 0.75)
        assert all(same_bits(x.cpu(), y) for x, y in zip(g, c))


class _Wrapped:
    """A non-torch DLPack producer on CUDA (as CuPy would be): exports the
    wrapped tensor through its own __dlpack__, passing the stream through."""

    def __init__(self, t):
        self.t = t
        self.streams = []

    def __dlpack_device__(self):
        return self.t.__dlpack_device__()

    def __dlpack__(self, stream=None, max_version=None, **kw):
        self.streams.append(stream)
        return self.t.__dlpack__(stream=stream)


@needs_gpu
def test_generic_cuda_producer():
    grads = random_tensors(19, ["float32", "float16"], count=4)
    w = [_Wrapped(t.cuda()) for t in grads]
    assert bitexact.total_norm(w) == bitexact.total_norm(grads)
    # no stream requested: per DLPack, the legacy default stream
    assert all(x.streams == [None] for x in w)


@needs_gpu
def test_process_group_on_cuda_single_rank():
    """process_group= with CUDA grads (the blocking norm, words through a
    gloo all-reduce in host memory): the same bits as without."""
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    if dist.is_initialized():
        pytest.skip("a default process group already exists in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        grads = random_tensors(23, ["float32", "bfloat16"], count=5)
        a, b = cuda_params(grads), cuda_params(grads)
        ta = bt.clip_grad_norm_(a, 0.1, process_group=dist.group.WORLD)
        tb = bt.clip_grad_norm_(b, 0.1)
        assert ta.device == tb.device and same_bits(ta, tb)
        assert all(same_bits(p.grad, q.grad) for p, q in zip(a, b))
    finally:
        dist.destroy_process_group()


# The sum of squares is (midpoint)^2 + tiny: the fp64 norm is exactly the
# midpoint between two values of the result dtype, the exact norm is above it.
@needs_gpu
@pytest.mark.parametrize("dtype,values,expect", [
    (torch.float32, [1.0, 2.0 ** -12, 2.0 ** -12, 2.0 ** -24, 2.0 ** -40], 1 + 2.0 ** -23),
    (torch.bfloat16, [1.0, 2.0 ** -4, 2.0 ** -4, 2.0 ** -8, 2.0 ** -40], 1 + 2.0 ** -7),
    (torch.float16, [16.0, 0.5, 2.0 ** -7, 2.0 ** -24], 16 + 2.0 ** -6),
], ids=["float32", "bfloat16", "float16"])
def test_no_double_rounding_stream_ordered(dtype, values, expect):
    """The stream-ordered norm in a narrower dtype is the exact norm rounded
    once (bx_cuda_norm_async_dtype), not the fp64 norm rounded again (which
    would round the midpoint to even, one unit low): get_total_norm and
    clip_grad_norm_'s returned norm, as on the CPU."""
    g = torch.tensor(values, dtype=dtype)
    assert float(bt.get_total_norm([g])) == expect  # CPU: exact
    # the fp64 norm (correctly rounded) is the midpoint: rounding it again is low
    assert float(torch.tensor(bitexact.total_norm([g]), dtype=torch.float64).to(dtype)) != expect
    ours = bt.get_total_norm([g.cuda()])
    assert ours.dtype == dtype and float(ours) == expect
    p = torch.nn.Parameter(g.cuda())
    p.grad = g.cuda()
    assert float(bt.clip_grad_norm_([p], 1e9)) == expect


@needs_gpu
def test_other_norm_rounded_once_stream_ordered():
    """A norm other than 2 and 1 (here the count of non-zeros, 2^24+2^16+1,
    in bf16): its fp64 value rounded once into the result dtype, as on the
    CPU (through fp32 it would land on a bf16 midpoint and round down)."""
    n = 2 ** 24 + 2 ** 16 + 1
    g = torch.ones(n, dtype=torch.bfloat16)
    expect = 2.0 ** 24 + 2.0 ** 17
    assert float(bt.get_total_norm([g], 0)) == expect
    ours = bt.get_total_norm([g.cuda()], 0)
    assert ours.dtype == torch.bfloat16 and float(ours) == expect


@needs_gpu
def test_shared_memory_counted_twice_by_norms():
    """Tensors sharing memory (the same tensor twice, overlapping views) are
    counted twice by a norm, as on the CPU and as torch does."""
    for mix in (["float32"], ["bfloat16"], ["float32", "float16"]):
        grads = random_tensors(29, mix, count=3)
        c = cuda(grads)
        t = c[0].reshape(-1)
        sets = [([c[0], c[0]], [grads[0], grads[0]]),
                (c + [c[1]], grads + [grads[1]]),
                ([t[: t.numel() // 2 + 1], t[t.numel() // 3:]] + c[1:],
                 [grads[0].reshape(-1)[: t.numel() // 2 + 1],
                  grads[0].reshape(-1)[t.numel() // 3:]] + grads[1:])]
        for on_gpu, on_cpu in sets:
            ours = bt.get_total_norm(on_gpu)
            assert same_bits(ours.cpu(), bt.get_total_norm(on_cpu)), mix
            theirs = torch.nn.utils.get_total_norm(on_gpu)
            assert ours.dtype == theirs.dtype
            prec = {torch.float32: 24, torch.bfloat16: 8}[ours.dtype]
            assert abs(float(ours) - float(theirs)) <= (4 * 2.0 ** -prec + 1e-6) * float(ours)
            for p in (1.0, math.inf):
                assert same_bits(bt.get_total_norm(on_gpu, p).cpu(),
                                 bt.get_total_norm(on_cpu, p))
        assert bitexact.total_norm([c[0], c[0]]) == bitexact.total_norm([grads[0], grads[0]])


@needs_gpu
def test_shared_memory_refused_by_scaling():
    """Clipping gradients that share memory would scale an element twice:
    LayoutError naming both parameters, nothing modified (also when the two
    are views of different dtypes, scaled by different per-dtype plans)."""
    grads = random_tensors(37, ["float32", "bfloat16"], count=4)
    ps = cuda_params(grads)
    ps[3] = torch.nn.Parameter(torch.zeros_like(ps[1]))
    ps[3].grad = ps[1].grad  # the same tensor twice
    snap = [p.grad.clone() for p in ps]
    with pytest.raises(bitexact.LayoutError, match=r"parameters\[1\] and parameters\[3\] "
                       "share memory"):
        bt.clip_grad_norm_(ps, 1e-3)
    with pytest.raises(bitexact.LayoutError, match=r"parameters\[1\] and parameters\[3\]"):
        bt.clip_grads_with_norm_(ps, 1e-3, torch.tensor(5.0, device="cuda"))
    torch.cuda.synchronize()
    assert all(same_bits(p.grad, s) for p, s in zip(ps, snap))
    # a bf16 view of an fp32 gradient's memory
    a = torch.nn.Parameter(torch.zeros(8, device="cuda"))
    a.grad = torch.randn(8, device="cuda")
    b = torch.nn.Parameter(torch.zeros(16, dtype=torch.bfloat16, device="cuda"))
    b.grad = a.grad.view(torch.bfloat16)
    snap = a.grad.clone()
    with pytest.raises(bitexact.LayoutError, match=r"parameters\[0\] and parameters\[1\]"):
        bt.clip_grad_norm_([a, b], 1e-3)
    torch.cuda.synchronize()
    assert same_bits(a.grad, snap)
    # the norm alone accepts them
    assert bt.get_total_norm([a.grad, b.grad]).dtype == torch.float32
    # the neutral (blocking) API: the norm counts twice, clipping refuses
    g = cuda(grads[:2])
    assert bitexact.total_norm([g[0], g[0]]) == bitexact.total_norm([grads[0], grads[0]])
    with pytest.raises(bitexact.LayoutError):
        bitexact.clip_grad_norm([g[0], g[1], g[0]], 1e-3)
    assert same_bits(g[0].cpu(), grads[0])
