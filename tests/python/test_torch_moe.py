"""bitexact.torch's GLM-4.5 MoE block (python/bitexact/torch/_moe.py):
(a) against transformers' Glm4MoeMoE (5.24, fp32, copied weights) and an
fp64 autograd transcription of the same formula; (b) a tiny model trained
with 1/2/4 micro-batches x 1/2 threads byte-identical, the transformers
model with torch's ops not (measured); (c) 2 gloo ranks = 1 process;
(d) bad input named, nothing modified."""
import os
import tempfile

import pytest
import torch
import torch.multiprocessing as mp
import torch.nn.functional as F

import bitexact
import bitexact.torch as bt
import torch_moe_model as M
from helpers import same_bits

pytest.importorskip("transformers.models.glm4_moe",
                    reason="transformers (pinned 5.24, scripts/py_setup.sh) is not installed")

U = 2.0 ** -24
D64 = torch.float64
T, C = 32, 8  # tokens of the block tests, chunk (= sequence) length


def rnd(*shape, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).float()


def params(m):
    return [p for _, p in m.named_parameters()]


def bx_step(m, x, dy, micro=((0, T),)):
    """out, x.grad and the parameters' gradients of sum(out * dy) through a
    GradReduction with chunks of C tokens."""
    red = bt.GradReduction(m.named_parameters(), C, T)
    xi = x.clone().requires_grad_(True)
    outs = {}

    def step(i):
        if i == 0:
            xi.grad = None  # a plain leaf: torch accumulates over one pass's micro-batches
        b, n = micro[i]
        xs = xi[b:b + n]
        out = m(xs)
        out.backward(dy[b:b + n])
        outs[i] = out.detach()
    red.run_two_pass(step, list(micro))
    return torch.cat([outs[i] for i in range(len(micro))]), xi.grad, [p.grad for p in params(m)]


def ref64(m, x, ids):
    """Glm4MoeMoE's formula in fp64 torch autograd on the experts `ids`
    (ascending per token): sigmoid scores, gathered, normalised + 1e-20,
    scaled; per expert SiLU(x Wg^T)(x Wu^T) Wd^T weighted, added; plus the
    shared MLP. Returns out, leaves (x, then MoE's parameters in order)."""
    leaves = [x.double().requires_grad_(True)] + \
        [p.detach().double().requires_grad_(True) for p in params(m)]
    x64, rw = leaves[0], leaves[1]
    ex = [leaves[2 + 3 * e:5 + 3 * e] for e in range(M.E)]
    sg, su, sd = leaves[-3:]
    s = torch.sigmoid(x64 @ rw.T)
    w = s.gather(1, ids)
    w = w / (w.sum(-1, keepdim=True) + 1e-20) * M.RSF
    out = torch.zeros_like(x64)
    for e, (wg, wu, wd) in enumerate(ex):
        t, j = torch.where(ids == e)
        y = (F.silu(x64[t] @ wg.T) * (x64[t] @ wu.T)) @ wd.T
        out = out.index_add(0, t, y * w[t, j, None])
    return out + (F.silu(x64 @ sg.T) * (x64 @ su.T)) @ sd.T, leaves


def forward_bound(m, x, ids):
    """First-order fp32 error bound of any evaluation of the block with
    these experts, per element (fp64): each length-n dot product of fp32
    values errs by <= (n+1) u sum|terms| (fmaf chains or pairwise sums
    alike), SiLU and the product h = SiLU(g) u by a few u (|SiLU'| <= 1.1),
    the routing weights by 12 u relative (bitexact <= 6 u, docs/train_moe.md;
    torch's sigmoid + fp32 denominator <= 3.11 ulp < 6.3 u measured there),
    the K+1 products and sums of the combine by (K+2) u each; doubled for
    the neglected second-order terms."""
    x64, a = x.double(), x.double().abs()
    p = [q.detach().double() for q in params(m)]
    s = torch.sigmoid(x64 @ p[0].T)
    w = s.gather(1, ids)
    w = (w / (w.sum(-1, keepdim=True) + 1e-20) * M.RSF).abs()

    def mlp(wg, wu, wd, xs, xa):
        g, u = xs @ wg.T, xs @ wu.T
        n_h, n_i = wg.shape[1], wg.shape[0]
        dg, du = (n_h + 1) * U * (xa @ wg.abs().T), (n_h + 1) * U * (xa @ wu.abs().T)
        h = F.silu(g) * u
        dh = 3 * U * h.abs() + 1.1 * dg * u.abs() + F.silu(g).abs() * du
        return (h @ wd.T).abs(), (n_i + 1) * U * (h.abs() @ wd.abs().T) + dh @ wd.abs().T
    bound = torch.zeros_like(x64)
    mag = torch.zeros_like(x64)
    for j in range(M.TOPK):
        for e in range(M.E):
            t = torch.where(ids[:, j] == e)[0]
            if t.numel() == 0:
                continue
            y, dy = mlp(*p[1 + 3 * e:4 + 3 * e], x64[t], a[t])
            wj = w[t, j, None]
            bound[t] += 12 * U * wj * y + wj * dy
            mag[t] += wj * y
    ys, dys = mlp(*p[-3:], x64, a)
    return 2 * (bound + dys + (M.TOPK + 2) * U * (mag + ys))


@pytest.fixture(scope="module")
def block():
    m = M.make_moe(0)
    x, dy = rnd(T, M.H, seed=11), rnd(T, M.H, seed=12)
    return m, x, dy


# ---- (a) against transformers and fp64 ---------------------------------------

def test_selection_and_forward_match_transformers(block):
    m, x, _ = block
    ref = M.hf_moe_from(m)
    ids, w, counts = m.route(x)
    with torch.no_grad():
        _, hw, hids = ref.gate(x)
        hout = ref(x)
        out = m(x)
    # the data are not tied: in fp64 the k-th and (k+1)-th choice scores of
    # the kept groups and the kept / dropped group scores are >= 1e-4 apart,
    # far above either implementation's few-ulp error, so the sets must agree
    c = torch.sigmoid(x.double() @ m.gate.weight.detach().double().T) + \
        m.gate.e_score_correction_bias.double()
    top2 = c.view(T, M.NG, -1).topk(2, dim=-1)[0].sum(-1).sort(-1, descending=True)[0]
    assert float((top2[:, M.KG - 1] - top2[:, M.KG]).min()) > 1e-4
    keep = c.view(T, M.NG, -1).topk(2, dim=-1)[0].sum(-1).topk(M.KG, dim=-1)[1]
    mask = torch.zeros(T, M.NG, dtype=torch.bool).scatter_(1, keep, True)
    cm = c.masked_fill(~mask.repeat_interleave(M.E // M.NG, 1), float("-inf"))
    cs = cm.sort(-1, descending=True)[0]
    assert float((cs[:, M.TOPK - 1] - cs[:, M.TOPK]).min()) > 1e-4
    hs, order = hids.sort(-1)
    assert torch.equal(ids, hs), "expert selection differs from transformers"
    assert torch.equal(counts.sum(0), torch.bincount(ids.reshape(-1), minlength=M.E))
    assert int((counts.sum(0) > 0).sum()) == M.E  # every expert has tokens
    hw = hw.gather(1, order)
    assert bool(((w.double() - hw.double()).abs() <= 12 * U * hw.double().abs()).all())
    o64, _ = ref64(m, x, ids)
    bnd = forward_bound(m, x, ids)
    for got, what in ((out, "bitexact"), (hout, "transformers")):
        err = (got.double() - o64.detach()).abs()
        assert bool((err <= bnd).all()), f"{what}: worst excess {float((err - bnd).max())}"
    assert float(bnd.max()) <= 1e-4 * float(o64.detach().abs().max())  # not vacuous
    assert bool(((out.double() - hout.double()).abs() <= 2 * bnd).all())


def test_gradients_match_transformers_and_fp64(block):
    # gradient tolerance: 1e-5 of each tensor's max |fp64 gradient| (~170 u:
    # the longest chains here, 32 tokens of a weight gradient through three
    # GEMM levels and the router's normalisation, give first-order errors
    # of ~(32 + 16 + 8) u times sums of magnitudes within a few times the
    # maximum); and no worse than 4x torch's own fp32 error (+ 8 u max).
    m, x, dy = block
    ids, _, _ = m.route(x)
    out, gx, grads = bx_step(m, x, dy)
    o64, leaves = ref64(m, x, ids)
    o64.backward(dy.double())
    ref = M.hf_moe_from(m)
    xh = x.clone().requires_grad_(True)
    ref(xh).backward(dy)
    names = ["x"] + [n for n, _ in m.named_parameters()]
    worst = {}
    for name, g, h, r in zip(names, [gx] + grads, [xh.grad] + M.hf_grads(ref),
                             [lf.grad for lf in leaves]):
        mx = float(r.abs().max())
        eb, eh = float((g.double() - r).abs().max()), float((h.double() - r).abs().max())
        worst[name] = (eb / mx, eh / mx)
        assert mx > 0, name
        assert eb <= 1e-5 * mx, f"{name}: bitexact error {eb / mx:.2e} of max"
        assert eb <= max(4 * eh, 8 * U * mx), f"{name}: bitexact {eb:.2e} vs torch {eh:.2e}"
    print("worst gradient error / max (bitexact, transformers):",
          max(v[0] for v in worst.values()), max(v[1] for v in worst.values()))


def test_experts_alone_and_route_consistent(block):
    # moe_experts with the router's ids/weights + the shared MLP = the block's
    # forward bits; its gradients to x and the weights are those of Glm4MoeExperts
    m, x, dy = block
    ids, w, _ = m.route(x)
    ex, sh = m.experts, m.shared_experts
    with torch.no_grad():
        routed = bt.moe_experts(x, ids, w, [e.gate_proj.weight for e in ex],
                                [e.up_proj.weight for e in ex], [e.down_proj.weight for e in ex])
        full, shared = m(x), sh(x)
    # the combine adds the shared output last: full = fl(routed + shared)
    assert same_bits(full, routed + shared)
    ref = M.hf_moe_from(m)
    xi, wi = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    red = bt.GradReduction([(f"experts.{i}", p) for i, p in enumerate(
        t for e in ex for t in (e.gate_proj.weight, e.up_proj.weight, e.down_proj.weight))], C, T)

    def step(i):
        xi.grad = wi.grad = None
        bt.moe_experts(xi, ids, wi, [e.gate_proj.weight for e in ex],
                       [e.up_proj.weight for e in ex],
                       [e.down_proj.weight for e in ex]).backward(dy)
    red.run_two_pass(step, [(0, T)])
    xh, wh = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    ref.experts(xh, ids, wh).backward(dy)
    for g, h in [(xi.grad, xh.grad), (wi.grad, wh.grad)] + list(zip(
            red.params, M.hf_grads(ref)[1:-3])):
        g = g.grad if isinstance(g, torch.nn.Parameter) else g
        assert float((g - h).abs().max()) <= 1e-5 * float(h.abs().max())


def _expert_weights(m):
    ex = m.experts
    return ([e.gate_proj.weight for e in ex], [e.up_proj.weight for e in ex],
            [e.down_proj.weight for e in ex])


def test_experts_alone_are_the_blocks_routed_stage_fp32_and_bf16(block):
    """In fp32 and in bf16 compute (GradReduction(compute_dtype="bf16")):
    the block's output = fl(moe_experts(router's ids, weights) + the shared
    MLP) bit for bit, and the expert weights' gradients of one step equal
    the block's; the bf16 outputs differ from the fp32 ones (the rounding
    is applied)."""
    m, x, dy = block
    ids, w, _ = m.route(x)
    names = [n for n, _ in m.named_parameters() if n.startswith("experts.")]
    routed, grads = {}, {}
    for dtype in ("fp32", "bf16"):
        red = bt.GradReduction(m.named_parameters(), C, T, compute_dtype=dtype)
        red.begin()
        with red.micro_batch(0, T), torch.no_grad():
            routed[dtype] = bt.moe_experts(x, ids, w, *_expert_weights(m))
            full, shared = m(x), m.shared_experts(x)
        assert same_bits(full, routed[dtype] + shared), dtype
        red = bt.GradReduction(m.named_parameters(), C, T, compute_dtype=dtype)
        red.run_two_pass(lambda i: m(x).backward(dy), [(0, T)])
        block_grads = {n: p.grad for n, p in m.named_parameters() if n in names}
        ex = [(n, p) for n, p in m.named_parameters() if n in names]
        red = bt.GradReduction(ex, C, T, compute_dtype=dtype)
        red.run_two_pass(lambda i: bt.moe_experts(x, ids, w, *_expert_weights(m)).backward(dy),
                         [(0, T)])
        bad = [n for n, p in ex if not same_bits(p.grad, block_grads[n])]
        assert not bad, (dtype, bad)
        grads[dtype] = block_grads
    assert not same_bits(routed["fp32"], routed["bf16"])
    assert not same_bits(grads["fp32"][names[0]], grads["bf16"][names[0]])


def test_micro_batches_and_threads_same_bits(block):
    m, x, dy = block
    base = bx_step(m, x, dy)
    for micro, th in (([(0, 16), (16, 16)], 1), ([(0, 8), (8, 8), (16, 16)], 2),
                      ([(i * 8, 8) for i in range(4)], 3)):
        m.num_threads = th
        try:
            got = bx_step(m, x, dy, tuple(micro))
        finally:
            m.num_threads = None
        assert same_bits(got[0], base[0]) and same_bits(got[1], base[1])
        assert all(same_bits(a, b) for a, b in zip(got[2], base[2])), (micro, th)


# ---- (b) the tiny model: layouts byte-identical, torch's ops not ----------------

@pytest.fixture(scope="module")
def runs():
    return {(mb, th): M.train_bitexact(mb, th) for mb in (1, 2, 4) for th in (1, 2)}


def _same_run(a, b):
    (la, fa, ga, pa), (lb, fb, gb, pb) = a, b
    return (all(same_bits(x, y) for x, y in zip(la, lb)) and
            all(same_bits(x, y) for x, y in zip(fa + ga + pa, fb + gb + pb)))


def test_tiny_model_layouts_byte_identical(runs):
    base = runs[(1, 1)]
    assert len(base[2]) == 3 + 1 + 3 * M.E + 3 + 1
    for k, r in runs.items():
        assert _same_run(r, base), f"micro-batches, threads = {k}"
    init = [p.detach() for p in M.Tiny().parameters()]
    assert not any(same_bits(a, b) for a, b in zip(init, base[3]))  # every tensor trained
    assert all(float(g.abs().max()) > 0 for g in base[2])  # every expert had tokens


def test_native_torch_differs_between_layouts(runs):
    nat = {(mb, th): M.train_native(mb, th) for mb, th in ((1, 1), (2, 1), (4, 1), (1, 2))}
    base = nat[(1, 1)]
    ndiff = {}
    for k, r in nat.items():
        if k == (1, 1):
            continue
        ndiff[k] = sum(not same_bits(a, b) for a, b in zip(r[2] + r[3], base[2] + base[3]))
    print("native tensors (last grads + params, of", 2 * len(base[2]), ") differing from "
          "(1 micro-batch, 1 thread):", ndiff)
    assert ndiff[(2, 1)] > 0 and ndiff[(4, 1)] > 0
    # the same model: step 0's loss and gradients agree with bitexact's to fp32 rounding
    bx = runs[(1, 1)]
    assert abs(float(bx[0][0]) - float(base[0][0])) <= 1e-5 * float(base[0][0])
    for a, b in zip(bx[1], base[1]):
        assert float((a - b).abs().max()) <= 1e-4 * float(b.abs().max())
    assert sum(not same_bits(a, b) for a, b in zip(bx[1], base[1])) > 0


# ---- (c) 2 gloo ranks = 1 process ------------------------------------------------

def test_two_ranks_data_parallel(runs):
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(M.worker, args=(2, d, 2), nprocs=2, join=True)
        res = [torch.load(os.path.join(d, f"rank{r}.pt"), weights_only=False) for r in range(2)]
    for r, o in enumerate(res):
        assert "exception" not in o, f"rank {r}:\n{o['exception']}"
        assert _same_run(o["run"], runs[(1, 1)]), f"rank {r}, 2 micro-batches each"
        assert _same_run(o["group"], runs[(1, 1)]), f"rank {r}, process group, 2 threads"


# ---- (d) bad input ------------------------------------------------------------------

def _args(m):
    ex, sh = m.experts, m.shared_experts
    return dict(x=None, router_weight=m.gate.weight,
                e_score_correction_bias=m.gate.e_score_correction_bias,
                gate_weights=[e.gate_proj.weight for e in ex],
                up_weights=[e.up_proj.weight for e in ex],
                down_weights=[e.down_proj.weight for e in ex],
                shared_gate_weight=sh.gate_proj.weight, shared_up_weight=sh.up_proj.weight,
                shared_down_weight=sh.down_proj.weight, num_experts_per_tok=M.TOPK,
                n_group=M.NG, topk_group=M.KG, routed_scaling_factor=M.RSF)


def _bad_router_dtype(a):
    a["router_weight"] = a["router_weight"].detach().double()


def _bad_router_shape(a):
    a["router_weight"] = torch.zeros(M.E, M.H + 1)


def _bad_bias_shape(a):
    a["e_score_correction_bias"] = torch.zeros(M.E - 1)


def _nan_bias(a):
    b = a["e_score_correction_bias"].clone()
    b[3] = float("nan")
    a["e_score_correction_bias"] = b


def _bad_expert(a):
    a["down_weights"] = list(a["down_weights"])
    a["down_weights"][3] = torch.zeros(M.H, M.MI + 1, requires_grad=True)


def _bad_device(a):
    a["x"] = torch.zeros(T, M.H, device="meta")


def _bad_topk(a):
    a["num_experts_per_tok"] = M.E + 1


@pytest.mark.parametrize("mutate,exc,name", [
    (_bad_router_dtype, bitexact.DTypeError, "router_weight"),
    (_bad_router_shape, bitexact.InvalidArgumentError, "router_weight"),
    (_bad_bias_shape, bitexact.InvalidArgumentError, "e_score_correction_bias"),
    (_nan_bias, bitexact.NonFiniteError, "bias"),
    (_bad_expert, bitexact.InvalidArgumentError, "experts.3.down_proj.weight"),
    (_bad_device, bitexact.DeviceError, "input"),
    (_bad_topk, bitexact.InvalidArgumentError, "num_experts_per_tok"),
])
def test_bad_input_named_nothing_modified(block, mutate, exc, name):
    m, x, dy = block
    clean = bx_step(m, x, dy)
    before = [p.detach().clone() for p in params(m)] + [m.gate.e_score_correction_bias.clone()]
    grads0 = [p.grad.clone() for p in params(m)]
    red = bt.GradReduction(m.named_parameters(), C, T)
    red.begin()
    for _ in range(2):  # pass 0 and pass 1: an error inside, then the good call
        with red.micro_batch(0, T):
            a = _args(m)
            a["x"] = x
            mutate(a)
            with pytest.raises(exc) as ei:
                bt.moe(**a)
            assert name in str(ei.value), str(ei.value)
            assert all(same_bits(p.grad, g) for p, g in zip(params(m), grads0))
            m(x).backward(dy)  # the failed call registered nothing: this works
        if red.phase == "bound":
            red.agree()
    red.finish()
    after = [p.detach() for p in params(m)] + [m.gate.e_score_correction_bias]
    assert all(same_bits(a, b) for a, b in zip(before, after))
    assert all(same_bits(p.grad, g) for p, g in zip(params(m), clean[2]))


@pytest.mark.parametrize("bad,name", [
    (lambda ids: ids.masked_fill(torch.arange(T)[:, None].eq(5) & torch.arange(M.TOPK).eq(1),
                                 M.E), "topk_ids"),   # id == E: out of range
    (lambda ids: ids.masked_fill(torch.arange(T)[:, None].eq(7) & torch.arange(M.TOPK).eq(0),
                                 -1), "topk_ids"),    # negative
    (lambda ids: torch.cat([ids[:, :1], ids[:, :1], ids[:, 2:]], 1), "topk_ids"),  # repeated
    (lambda ids: ids[:T - 1], "topk_ids"),            # rows != tokens
    (lambda ids: ids.float(), "topk_ids"),            # dtype
])
def test_experts_bad_ids(block, bad, name):
    m, x, _ = block
    ids, w, _ = m.route(x)
    ex = m.experts
    wts = [[e.gate_proj.weight for e in ex], [e.up_proj.weight for e in ex],
           [e.down_proj.weight for e in ex]]
    before = [p.detach().clone() for p in params(m)]
    with torch.no_grad(), pytest.raises((bitexact.InvalidArgumentError, bitexact.DTypeError)) as ei:
        bt.moe_experts(x, bad(ids), w, *wts)
    assert name in str(ei.value), str(ei.value)
    assert all(same_bits(a, b.detach()) for a, b in zip(before, params(m)))


def test_trainable_without_reduction_refused(block):
    m, x, _ = block
    with pytest.raises(bitexact.InvalidArgumentError, match="GradReduction"):
        m(x)
    with torch.no_grad():  # inference needs none
        assert m(x).shape == x.shape
