"""bitexact.torch where torch's own clip tests need torch's behaviour:
the non-finite error text, p = 0 with NaN/Inf, sparse and complex
gradients, and torch.compile(fullgraph=True) (the custom ops). The FSDP2
DTensor result is in test_distributed.py (real gloo processes)."""
import math
import re

import pytest
import torch

import bitexact
import bitexact.torch as bt
from exact_ref import exact_norm
from helpers import FMT, params_with_grads, random_tensors, same_bits

inf, nan = math.inf, math.nan


def _torch_message(grads, p):
    """torch's own non-finite error text for these gradients."""
    with pytest.raises(RuntimeError) as info:
        torch.nn.utils.clip_grad_norm_(params_with_grads(grads), 1.0, p, error_if_nonfinite=True)
    return str(info.value)


# ---- the non-finite error: torch's text first ------------------------------

@pytest.mark.parametrize("p", [2, 2.0, 1.0, inf, 3.0])
def test_nonfinite_message_starts_with_torchs(p):
    grads = random_tensors(7, ["float32", "bfloat16"], count=4)
    grads[2].view(-1)[3] = nan
    want = _torch_message(grads, p)
    # the regex torch's tests use, with torch's formatting of p
    regex = (f"The total norm of order {float(p)} for gradients from `parameters` "
             "is non-finite")
    params = params_with_grads(grads)
    before = [g.clone() for g in grads]
    with pytest.raises(RuntimeError, match=regex) as info:
        bt.clip_grad_norm_(params, 1.0, p, error_if_nonfinite=True)
    assert isinstance(info.value, bitexact.NonFiniteError)
    msg = str(info.value)
    assert msg.startswith(want), (msg, want)
    # then bitexact's detail: which tensor
    assert re.search(r"bitexact: .*parameters\[2\] holds NaN", msg[len(want):]), msg
    assert all(same_bits(q.grad, b) for q, b in zip(params, before))
    with pytest.raises(bitexact.NonFiniteError, match=regex) as info:
        bt.get_total_norm(grads, p, error_if_nonfinite=True)
    assert str(info.value).startswith(want) and "tensors[2] holds NaN" in str(info.value)


# ---- p = 0: NaN and Inf are non-zero ---------------------------------------

def _count_nonzero(tensors):
    """An independent count: Python floats, NaN != 0 is True."""
    return sum(1 for t in tensors for x in t.detach().double().flatten().tolist() if x != 0)


@pytest.mark.parametrize("dtypes", [["float32"], ["bfloat16"], ["float32", "float16", "float64"]])
def test_p0_counts_nan_and_inf(dtypes):
    grads = random_tensors(11, dtypes, count=6, max_numel=400)
    g = torch.Generator().manual_seed(3)
    for t, v in zip(grads, [nan, inf, -inf, 0.0, nan, inf]):
        flat = t.view(-1)
        idx = torch.randint(0, flat.numel(), (3,), generator=g)
        flat[idx] = v
    want = _count_nonzero(grads)
    dtype = torch.nn.utils.get_total_norm(grads, 0.0).dtype
    for err in (False, True):
        t = bt.get_total_norm(grads, 0.0, error_if_nonfinite=err)
        assert t.dtype == dtype and float(t) == float(torch.tensor(float(want), dtype=dtype))
    params = params_with_grads(grads)
    total = bt.clip_grad_norm_(params, 1.0, 0.0, error_if_nonfinite=True)
    assert same_bits(total, bt.get_total_norm(grads, 0.0))
    # scaled as torch scales by that norm (NaN stays NaN)
    ref = params_with_grads(grads)
    torch.nn.utils.clip_grads_with_norm_(ref, 1.0, total)
    for a, b in zip(params, ref):
        assert torch.equal(a.grad.isnan(), b.grad.isnan())
        assert same_bits(a.grad.nan_to_num(0.0), b.grad.nan_to_num(0.0))


# ---- sparse gradients -------------------------------------------------------

def _embedding_params(dtype=torch.float32, seed=0):
    """A model with an nn.Embedding(sparse=True) (repeated indices: an
    uncoalesced gradient) and a dense layer."""
    torch.manual_seed(seed)
    emb = torch.nn.Embedding(20, 6, sparse=True, dtype=dtype)
    lin = torch.nn.Linear(6, 3, dtype=dtype)
    idx = torch.tensor([[1, 4, 1, 7], [4, 4, 19, 0]])
    lin(emb(idx)).pow(2).sum().backward()
    return [emb.weight, lin.weight, lin.bias]


def _min_abs(tensors):
    return min(abs(x) for t in tensors for x in t.double().flatten().tolist())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("p", [2.0, 1.0, inf, -inf, 0.0, 3.0])
def test_sparse_norm_is_the_coalesced_values_norm(dtype, p):
    params = _embedding_params(dtype)
    sp = params[0].grad
    assert sp.is_sparse and not sp.is_coalesced()
    grads = [q.grad for q in params]
    dense = [sp.coalesce().values()] + grads[1:]
    total = bt.get_total_norm(grads, p)
    ref = torch.nn.utils.get_total_norm(grads, p)
    assert total.dtype == ref.dtype
    fmt = FMT[total.dtype]
    if p in (2.0, 1.0, inf, 0.0):
        assert float(total) == exact_norm(dense, fmt, p)
    elif p == -inf:
        assert float(total) == float(torch.tensor(_min_abs(dense), dtype=dtype))
    else:  # the library's norm of the same dense values
        assert same_bits(total, bt.get_total_norm(dense, p))
    if p != 0.0:  # torch's p = 0 counts tensors
        # close to torch's (which rounds per tensor): the coalesced values,
        # not the stored duplicates
        assert math.isclose(float(total), float(ref), rel_tol=2e-2)
    assert sp.is_sparse and not sp.is_coalesced()  # the gradient was not modified


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sparse_clip_has_torchs_bits(dtype):
    ours, theirs = _embedding_params(dtype), _embedding_params(dtype)
    total = bt.clip_grad_norm_(ours, 0.5)
    assert float(total) > 0.5  # clipping active
    torch.nn.utils.clip_grads_with_norm_(theirs, 0.5, total)
    for a, b in zip(ours, theirs):
        assert a.grad.layout == b.grad.layout
        if a.grad.is_sparse:  # same stored entries, in the same order, same bits
            assert torch.equal(a.grad._indices(), b.grad._indices())
            assert same_bits(a.grad._values(), b.grad._values())
        else:
            assert same_bits(a.grad, b.grad)
    # the two-step API too
    again = _embedding_params(dtype)
    bt.clip_grads_with_norm_(again, 0.5, bt.get_total_norm([q.grad for q in again]))
    assert all(same_bits(a.grad, b.grad) for a, b in zip(again, theirs))


def test_compressed_sparse_layout_refused():
    params = params_with_grads(random_tensors(5, ["float32"], count=3))
    holder = type("P", (), {})()
    holder.grad = torch.eye(4).to_sparse_csr()
    params.insert(1, holder)
    before = [q.grad.clone() for q in params]
    with pytest.raises(bitexact.LayoutError, match=r"parameters\[1\]: layout torch.sparse_csr"):
        bt.clip_grad_norm_(params, 1e-3)
    assert all(same_bits(q.grad.to_dense(), b.to_dense()) for q, b in zip(params, before))


# ---- complex gradients ------------------------------------------------------

def _complex(seed, dtype, shape=(37, 5)):
    g = torch.Generator().manual_seed(seed)
    re_, im = (torch.randn(shape, generator=g, dtype=torch.float64) for _ in range(2))
    z = torch.complex(re_, im) * 2.0 ** torch.randint(-6, 7, shape, generator=g)
    z.view(-1)[::9] = 0
    return z.to(dtype)


@pytest.mark.parametrize("cdtype,real,want", [
    (torch.complex64, None, torch.float32),
    (torch.complex64, torch.bfloat16, torch.float32),
    (torch.complex128, torch.float32, torch.float64),
    (torch.complex64, torch.float64, torch.float64),
])
def test_complex_dtype_and_exact_p2(cdtype, real, want):
    grads = [_complex(1, cdtype), _complex(2, cdtype, (9,))]
    if real is not None:
        grads += random_tensors(4, [FMT[real]], count=3)
    total = bt.get_total_norm(grads)
    assert total.dtype == want == torch.nn.utils.get_total_norm(grads).dtype
    # |z|^2 = re^2 + im^2: the exact norm of the real and imaginary parts
    parts = [torch.view_as_real(g) if g.is_complex() else g for g in grads]
    assert float(total) == exact_norm(parts, FMT[want])
    assert math.isclose(float(total), float(torch.nn.utils.get_total_norm(grads)), rel_tol=1e-5)


@pytest.mark.parametrize("p", [1.0, inf, -inf, 0.0, 3.0])
@pytest.mark.parametrize("cdtype", [torch.complex64, torch.complex128])
def test_complex_other_p(cdtype, p):
    z = _complex(3, cdtype)
    if p == 0.0:
        z.view(-1)[4] = complex(nan, 1.0)
    grads = [z, torch.randn(10, dtype=cdtype.to_real())]
    total = bt.get_total_norm(grads, p)
    assert total.dtype == cdtype.to_real()
    # |z| in the wider dtype (fp64), then the exact norm rounded once
    absz = [z.to(torch.complex128).abs(), grads[1]]
    fmt = FMT[total.dtype]
    if p == 0.0:
        assert float(total) == sum(1 for c in z.flatten().tolist() if c != 0) + 10
    elif p == -inf:
        assert float(total) == float(torch.tensor(_min_abs(absz), dtype=total.dtype))
    elif p in (1.0, inf):
        assert float(total) == exact_norm(absz, fmt, p)
    else:
        assert same_bits(total, bt.get_total_norm(absz, p).to(total.dtype))
    if p != 0.0:
        assert math.isclose(float(total), float(torch.nn.utils.get_total_norm(grads, p)),
                            rel_tol=1e-5)


def test_mixed_real_complex_sparse_clip_has_torchs_bits():
    def model():
        ps = _embedding_params(torch.float32, seed=4)
        extra = params_with_grads([_complex(5, torch.complex64),
                                   _complex(6, torch.complex64, (7,))])
        return ps[:1] + extra[:1] + ps[1:] + extra[1:]
    ours, theirs = model(), model()
    total = bt.clip_grad_norm_(ours, 0.25)
    assert total.dtype == torch.float32 and float(total) > 0.25
    torch.nn.utils.clip_grads_with_norm_(theirs, 0.25, total)
    for a, b in zip(ours, theirs):
        assert same_bits(a.grad, b.grad)
        if a.grad.is_complex():
            assert same_bits(torch.view_as_real(a.grad), torch.view_as_real(b.grad))
    # the norm: exact over coalesced sparse values, re/im of complex, dense
    fresh = model()
    parts = []
    for q in fresh:
        g = q.grad.coalesce().values() if q.grad.is_sparse else q.grad
        parts.append(torch.view_as_real(g) if g.is_complex() else g)
    assert float(total) == exact_norm(parts, "float32")


def test_complex_nonfinite_raises_torchs_message_and_modifies_nothing():
    z = _complex(8, torch.complex64)
    z.view(-1)[2] = complex(inf, 0.0)
    params = params_with_grads([torch.ones(3), z])
    before = [q.grad.clone() for q in params]
    want = _torch_message([torch.ones(3), z], 2.0)
    with pytest.raises(bitexact.NonFiniteError) as info:
        bt.clip_grad_norm_(params, 1.0, error_if_nonfinite=True)
    assert str(info.value).startswith(want) and "parameters[1]" in str(info.value)
    assert all(same_bits(q.grad, b) for q, b in zip(params, before))


# ---- torch.compile(fullgraph=True): the custom ops --------------------------
# The model's data are small dyadic numbers (multiples of 1/16, integer
# inputs): every forward and backward sum is exact, so inductor's fused,
# reordered arithmetic gives eager's bits there too, and any difference
# left would be the clipping's. The SGD learning rate is a power of two
# (lr * g exact: the update rounds once, fused or not).

def _dyadic_model(seed):
    g = torch.Generator().manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randint(-8, 9, p.shape, generator=g).float() / 16)
    return m


def _dyadic_batch(seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(-4, 5, (8, 8), generator=g).float(),
            torch.randint(-4, 5, (8, 4), generator=g).float())


def _update(params, grads, opt, state):
    """torch.optim's functional update (its .step() graph-breaks)."""
    from torch.optim.adamw import adamw
    from torch.optim.sgd import sgd
    with torch.no_grad():
        if opt == "sgd":
            sgd(params, grads, [None] * len(params), weight_decay=0.0, momentum=0.0,
                lr=0.25, dampening=0.0, nesterov=False, maximize=False, foreach=False)
        else:
            adamw(params, grads, state[0], state[1], [], state[2], foreach=False,
                  amsgrad=False, beta1=0.9, beta2=0.999, lr=1e-2, weight_decay=0.01,
                  eps=1e-8, maximize=False)


def _adam_state(params):
    return ([torch.zeros_like(p) for p in params], [torch.zeros_like(p) for p in params],
            [torch.tensor(0.0) for _ in params])


def _train_step(model, opt):
    """forward, loss, backward, bitexact clip, optimizer step: returns what
    the test compares (the parameters are compared after the call)."""
    params = list(model.parameters())
    state = _adam_state(params)

    def step(x, y):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        grads = [p.grad for p in params]
        pre = [g.clone() for g in grads]
        norm = bt.clip_grad_norm_(params, 1.0)
        clipped = [g.clone() for g in grads]
        _update(params, grads, opt, state)
        for p in params:
            p.grad = None
        return loss.detach(), norm, pre, clipped
    return step


@pytest.fixture
def autograd_in_graph():
    """Dynamo traces loss.backward() only with trace_autograd_ops."""
    old = torch._dynamo.config.trace_autograd_ops
    torch._dynamo.config.trace_autograd_ops = True
    torch._dynamo.reset()
    yield
    torch._dynamo.config.trace_autograd_ops = old
    torch._dynamo.reset()


@pytest.mark.parametrize("opt", ["sgd", "adamw"])
def test_compiled_training_step_has_eager_bits(autograd_in_graph, opt):
    """torch.compile(fullgraph=True), inductor: the step is one graph
    (bitexact's clip is a custom op, traced through its fake). Eager and
    compiled give the same loss, norm, and gradients before and after
    clipping, over two steps (parameters reset to dyadic values before
    each); with SGD the same parameters after the update. torch's AdamW
    rounds differently once compiled, whatever clips (its bias corrections
    become fp32 tensor arithmetic instead of Python floats), so there the
    updated parameters are compared with the compiled AdamW alone applied
    to the clipped gradients after the first step (and differ from it
    applied to the unclipped ones: the update reads the clipped gradients)."""
    me, mc = _dyadic_model(0), _dyadic_model(0)
    eager = _train_step(me, opt)
    compiled = torch.compile(_train_step(mc, opt), fullgraph=True)
    update = torch.compile(lambda ps, gs, st: _update(ps, gs, opt, st), fullgraph=True)
    for k in range(2):
        x, y = _dyadic_batch(10 + k)
        start = list(_dyadic_model(k).parameters())
        with torch.no_grad():
            for a, b, c in zip(me.parameters(), mc.parameters(), start):
                a.copy_(c)
                b.copy_(c)
        le, ne, pe, ce = eager(x, y)
        lc, nc, pc, cc = compiled(x, y)
        assert float(ne) > 1.0  # clipping active
        assert same_bits(le, lc) and same_bits(ne, nc), (k, le, lc, ne, nc)
        assert float(nc) == exact_norm(pc, "float32")
        assert all(same_bits(a, b) for a, b in zip(pe, pc)), k
        assert all(same_bits(a, b) for a, b in zip(ce, cc)), k
        if opt == "sgd":
            assert all(same_bits(a, b) for a, b in zip(me.parameters(), mc.parameters())), k
        elif k == 0:  # AdamW from the same (fresh) state as the step's first
            for gs, want in ((cc, True), (pc, False)):
                ps = [c.detach().clone() for c in start]
                update(ps, [g.clone() for g in gs], _adam_state(ps))
                assert all(same_bits(a, b) for a, b in zip(ps, mc.parameters())) == want


def test_compiled_norm_and_two_step_clip(autograd_in_graph):
    """get_total_norm and clip_grads_with_norm_ alone under
    torch.compile(fullgraph=True, inductor): eager's bits, torch's dtype."""
    grads = random_tensors(21, ["float32", "bfloat16", "float16"], count=6, max_numel=500)

    def two_step(gs, p):
        total = bt.get_total_norm(gs, p)
        bt.clip_grads_with_norm_([_Holder(g) for g in gs], 1e-3, total)
        return total

    f = torch.compile(two_step, fullgraph=True)
    for p in (2.0, 1.0, inf):
        ours = [g.clone() for g in grads]
        ref = [g.clone() for g in grads]
        total = f(ours, p)
        want = bt.get_total_norm(ref, p)
        assert same_bits(total, want) and total.dtype == torch.float32
        bt.clip_grads_with_norm_([_Holder(g) for g in ref], 1e-3, want)
        assert all(same_bits(a, b) for a, b in zip(ours, ref)), p
        assert not all(same_bits(a, b) for a, b in zip(ours, grads))  # it did clip
    gn = torch.compile(lambda gs: bt.get_total_norm(gs), fullgraph=True)
    bf = random_tensors(22, ["bfloat16"], count=3)
    assert same_bits(gn(bf), bt.get_total_norm(bf)) and gn(bf).dtype == torch.bfloat16


class _Holder:
    def __init__(self, grad):
        self.grad = grad


def test_compiled_nonfinite_error_and_eager_only_options():
    g = [torch.ones(4), torch.tensor([1.0, nan])]
    f = torch.compile(lambda gs: bt.get_total_norm(gs, error_if_nonfinite=True), fullgraph=True)
    with pytest.raises(RuntimeError, match="The total norm of order 2.0 for gradients from "
                                           "`parameters` is non-finite"):
        f(g)
    # owned= / process_group= / DTensor / sparse: eager only, a graph break
    h = [torch.ones(4), torch.full((3,), 2.0)]
    with pytest.raises(Exception, match="process_group=, owned=, DTensor and sparse"):
        torch.compile(lambda gs: bt.get_total_norm(gs, owned=True), fullgraph=True)(h)
    gb = torch.compile(lambda gs: bt.get_total_norm(gs, owned=True) * 1, fullgraph=False)
    assert same_bits(gb(h), bt.get_total_norm(h))


def test_custom_ops_pass_opcheck():
    """torch.library.opcheck: schema (mutations declared), fake kernels
    (dtype/device), and the ops under the dispatcher's checks."""
    grads = random_tensors(23, ["float32", "bfloat16"], count=3, max_numel=200)
    z = [_complex(24, torch.complex64, (6,))]
    # norm_dtype defaults to "" (torch's promotion): callers of the ops
    # from before it existed keep working
    torch.library.opcheck(torch.ops.bitexact.total_norm.default, (grads, 2.0, False, "exact", 0))
    torch.library.opcheck(torch.ops.bitexact.total_norm.default,
                          (grads, 2.0, False, "exact", 0, "float64"))
    torch.library.opcheck(torch.ops.bitexact.total_norm.default, (z, 1.0, False, "exact", 0, ""))
    for nd in ("", "float32"):
        torch.library.opcheck(torch.ops.bitexact.clip_grad_norm_.default,
                              ([g.clone() for g in grads], [0, 1, 2], 1e-3, 2.0, False, "torch",
                               "exact", 0, nd))
    torch.library.opcheck(torch.ops.bitexact.clip_grads_with_norm_.default,
                          ([g.clone() for g in grads], 1e-3, torch.tensor(5.0), "torch", 0))
