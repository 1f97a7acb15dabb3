"""bitexact.torch's layers under torch.compile (python/bitexact/
torch/_compile.py): a step through every layer function compiled with
fullgraph=True (no graph break possible) gives the eager bits -- loss,
every weight gradient, the plain leaves' gradients -- over two micro-
batches; the layers really run as the custom op; a failing compiled call
raises the eager exception, named, and changes nothing; a second
backward is refused; the call table frees what autograd frees; moe_route
is a graph break."""
import gc

import pytest
import torch

import bitexact
import bitexact.torch as bt
from bitexact.torch import _compile as tc
from helpers import same_bits

T, L, H, V = 16, 8, 8, 32  # tokens (2 sequences of L), hidden, vocabulary
HQ, HKV, D, I, E, K = 2, 1, 4, 6, 4, 2


def rnd(*shape, seed=0, scale=0.5):
    g = torch.Generator().manual_seed(seed)
    return torch.nn.Parameter((torch.randn(*shape, generator=g) * scale).float())


def make_params():
    shapes = dict(emb=(V, H), norm=(H,), wq=(HQ * D, H), wk=(HKV * D, H), wv=(HKV * D, H),
                  bq=(HQ * D,), bk=(HKV * D,), bv=(HKV * D,), wo=(H, HQ * D), g=(I, H),
                  u=(I, H), d=(H, I), rw=(E, H), sg=(I, H), su=(I, H), sd=(H, I),
                  head=(V, H))
    P = {n: rnd(*s, seed=k + 1) for k, (n, s) in enumerate(shapes.items())}
    for e in range(E):  # the routed experts of moe, and moe_experts' own
        for w, s in (("eg", (I, H)), ("eu", (I, H)), ("ed", (H, I)),
                     ("fg", (I, H)), ("fu", (I, H)), ("fd", (H, I))):
            P[f"{w}{e}"] = rnd(*s, seed=100 + 7 * e + len(P))
    return P


def forward(P, ids, targets, tw, gate_in):
    """Every layer function of bitexact.torch, chained (fixed routing for
    moe_experts: a leaf topk_weights tw gets its gradient)."""
    bias = torch.zeros(E)
    n = ids.shape[0]  # the micro-batch's tokens
    pos = torch.arange(L, dtype=torch.int64).repeat(n // L)
    h = bt.rms_norm(bt.embedding(ids, P["emb"]), P["norm"])
    q, k, v = bt.qkv_projection(h, P["wq"], P["wk"], P["wv"], q_bias=P["bq"], k_bias=P["bk"],
                                v_bias=P["bv"])
    q, k = bt.rope(q, pos, D, 2), bt.rope(k, pos, D, 2)
    h = h + bt.linear(bt.causal_attention(q, k, v, L, HQ, HKV, D), P["wo"])
    h = h + bt.swiglu_mlp(h, P["g"], P["u"], P["d"])
    h = h + bt.moe(h, P["rw"], bias, [P[f"eg{e}"] for e in range(E)],
                   [P[f"eu{e}"] for e in range(E)], [P[f"ed{e}"] for e in range(E)],
                   P["sg"], P["su"], P["sd"], K, routed_scaling_factor=1.5)
    tids = torch.tensor([[(t + j) % E for j in range(K)] for t in range(n)]).sort(1).values
    h = h + bt.moe_experts(h, tids, tw, [P[f"fg{e}"] for e in range(E)],
                           [P[f"fu{e}"] for e in range(E)], [P[f"fd{e}"] for e in range(E)])
    h = h * bt.swiglu(gate_in, h)  # swiglu with a leaf gate
    return bt.cross_entropy(bt.linear(h, P["head"]), targets)


def data():
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, V, (T,), generator=g)
    targets = torch.randint(0, V, (T,), generator=g)
    tw = (torch.rand(T, K, generator=g) + 0.5).requires_grad_()
    gate_in = torch.randn(T, H, generator=g).requires_grad_()
    return ids, targets, tw, gate_in


def run_step(fn, P, micro=((0, 8), (8, 8))):
    """A two-pass step of fn over the micro-batches; returns (loss, the
    weight gradients, the leaves' gradients of pass 1)."""
    ids, targets, tw, gate_in = data()
    red = bt.GradReduction(list(P.items()), L, T)

    def step(i):
        b, n = micro[i]
        tw.grad = gate_in.grad = None
        loss = fn(P, ids[b:b + n], targets[b:b + n], tw[b:b + n], gate_in[b:b + n])
        loss.backward()
        return tw.grad.clone(), gate_in.grad.clone()
    leaves = red.run_two_pass(step, list(micro))
    return red.loss, {n: p.grad for n, p in P.items()}, leaves


@pytest.fixture(scope="module")
def eager():
    return run_step(forward, make_params())


def test_fullgraph_step_equals_eager(eager):
    """torch.compile(fullgraph=True): one graph, every layer the custom op,
    the eager bits everywhere (no tolerance: the same kernels in the same
    order)."""
    torch._dynamo.reset()
    before = next(tc._COUNT)
    loss, grads, leaves = run_step(torch.compile(forward, fullgraph=True), make_params())
    calls = next(tc._COUNT) - before - 1
    assert calls == 2 * 2 * 13, calls  # 13 layer calls per forward, 2 micro-batches, 2 passes
    e_loss, e_grads, e_leaves = eager
    assert same_bits(loss, e_loss)
    bad = [n for n in grads if not same_bits(grads[n], e_grads[n])]
    assert not bad, bad
    for (a, b), (c, d) in zip(leaves, e_leaves):
        assert same_bits(a, c) and same_bits(b, d)
    assert not tc._RECORDS  # every backward ran and dropped its call
    assert float(tc.SINK.grad) == 0.0


def test_compiled_bad_input_raises_the_eager_error_and_changes_nothing():
    lin = bt.Linear(4, 3)
    red = bt.GradReduction([lin.weight], 2, 4)
    f = torch.compile(lambda x: lin(x).sum(), fullgraph=True)
    red.begin()
    with red.micro_batch(0, 4):
        with pytest.raises(bitexact.DTypeError) as ei:
            f(torch.ones(4, 4, dtype=torch.float64))
        assert ei.value.argument == "input"
        with pytest.raises(bitexact.InvalidArgumentError, match="'input'"):
            f(torch.ones(2, 4))  # 2 rows, the micro-batch holds 4 tokens
        f(torch.ones(4, 4)).backward()  # nothing was registered by the failures
    assert lin.weight.grad is None
    red.agree()
    with red.micro_batch(0, 4):
        f(torch.ones(4, 4)).backward()
    red.finish()
    assert same_bits(lin.weight.grad, torch.full((3, 4), 4.0))


def test_second_backward_refused():
    lin = bt.Linear(4, 3)
    red = bt.GradReduction([lin.weight], 4, 4)
    f = torch.compile(lambda x: lin(x).sum(), fullgraph=True)
    x = torch.ones(4, 4, requires_grad=True)
    red.begin()
    with red.micro_batch(0, 4):
        y = f(x)
        y.backward(retain_graph=True)
        with pytest.raises(bitexact.InvalidArgumentError, match="backward ran already"):
            y.backward()


def test_call_table_follows_the_graph():
    """A forward without grad keeps nothing; a graph dropped before its
    backward drops its calls."""
    lin = bt.Linear(4, 3)
    lin.weight.requires_grad_(False)
    f = torch.compile(lambda x: lin(x).sum(), fullgraph=True)
    with torch.no_grad():
        f(torch.ones(4, 4, requires_grad=True))
    assert not tc._RECORDS
    y = f(torch.ones(4, 4, requires_grad=True))  # frozen weight: dx only, no reduction needed
    assert len(tc._RECORDS) == 1
    del y
    gc.collect()
    assert not tc._RECORDS


def test_moe_route_is_a_graph_break():
    x, rw = torch.randn(8, H), torch.randn(E, H)
    want = bt.moe_route(x, rw, torch.zeros(E), K)
    got = torch.compile(lambda a: bt.moe_route(a, rw, torch.zeros(E), K))(x)
    assert all(same_bits(a, b) for a, b in zip(got, want))
    with pytest.raises(Exception, match="moe_route is not traced"):
        torch.compile(lambda a: bt.moe_route(a, rw, torch.zeros(E), K), fullgraph=True)(x)


def test_compiled_non_tensor_argument_named():
    """A list where a tensor goes: bitexact's error at trace time (under
    fullgraph=True Dynamo reports it as the reason it cannot trace)."""
    w = torch.nn.Parameter(torch.ones(3, 4))
    with pytest.raises(bitexact.InvalidArgumentError, match="linear: argument 0 is a list"):
        torch.compile(lambda x: bt.linear(x, w))([[1.0] * 4] * 4)
    with pytest.raises(Exception, match="argument 0 is a list"):
        torch.compile(lambda x: bt.linear(x, w), fullgraph=True)([[1.0] * 4] * 4)


def test_compiled_adamw_step_equals_eager():
    """torch.compile(opt.step, fullgraph=True): bitexact::adamw_, the
    eager bits after 4 steps (parameters, both moments, the step count);
    one recompile at most (the state is created at the first step)."""
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(3)
    ws = [torch.nn.Parameter(torch.randn(5, 3, generator=g)) for _ in range(3)]
    ws2 = [torch.nn.Parameter(w.detach().clone()) for w in ws]
    o1, o2 = bt.AdamW(ws, lr=0.1, weight_decay=0.1), bt.AdamW(ws2, lr=0.1, weight_decay=0.1)
    step = torch.compile(o2.step, fullgraph=True)
    for i in range(4):
        for a, b in zip(ws, ws2):
            a.grad = torch.randn(5, 3, generator=g)
            b.grad = a.grad.clone()
        ws[1].grad = ws2[1].grad = None if i == 0 else ws[1].grad  # a late parameter
        o1.step()
        step()
    for a, b in zip(ws, ws2):
        assert same_bits(a.detach(), b.detach())
        for k in ("exp_avg", "exp_avg_sq", "step"):
            assert same_bits(o1.state[a][k], o2.state[b][k]), k
    assert int(o2.state[ws2[0]]["step"]) == 4 and int(o2.state[ws2[1]]["step"]) == 3
    assert not same_bits(ws[0].detach(), ws[0].detach() * 0)  # (a real update happened)


def test_compiled_adamw_bad_gradient_named():
    """A gradient the kernel refuses (strided): the eager error, raised by
    the compiled step, nothing updated."""
    errors = []
    for compiled in (False, True):
        w = torch.nn.Parameter(torch.ones(3))
        opt = bt.AdamW([w])
        w.grad = torch.ones(6)[::2]
        step = torch.compile(opt.step, fullgraph=True) if compiled else opt.step
        with pytest.raises(bitexact.Error) as ei:
            step()
        errors.append((type(ei.value), str(ei.value)))
        assert same_bits(w.detach(), torch.ones(3))
        st = opt.state[w]  # eager creates the zero state first; compiled, nothing at all
        assert not st or (int(st["step"]) == 0 and not st["exp_avg"].any())
    assert errors[0] == errors[1], errors
