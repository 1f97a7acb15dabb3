"""bitexact.megatron against the real megatron-core from PyPI (pinned in
scripts/py_setup.sh), on CPU with gloo. Megatron's own functions run with
their 'cuda' allocations made on the CPU (megatron_worker.CudaOnCpu: the
module doc lists exactly what is redirected) and its pure-torch
multi_tensor fallbacks (no Transformer Engine, no Apex here)."""
import inspect
import math
import os
import sys
import tempfile
import types

import pytest
import torch

mcore = pytest.importorskip(
    "megatron.core", reason="megatron-core is not importable (scripts/py_setup.sh installs "
    "the pinned MEGATRON_CORE_PIN)")

import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import bitexact  # noqa: E402
import bitexact.megatron as bm  # noqa: E402
import megatron_worker as W  # noqa: E402
from exact_ref import exact_megatron, exact_norm  # noqa: E402
from helpers import random_tensors, same_bits  # noqa: E402

import megatron.core.optimizer.clip_grads as CG  # noqa: E402
import megatron.core.optimizer.layer_wise_optimizer as LW  # noqa: E402
import megatron.core.optimizer.optimizer as OPT  # noqa: E402

INF = float("inf")
# Megatron's norm is fp32 arithmetic: torch.norm of each tensor (fp32
# accumulation over <= 3000 elements), the norm of those norms, its fp32
# square, then ** 0.5 in fp64: a few fp32 roundings (2^-24 each) plus the
# accumulation error, far below 2^-16 relative at these sizes, and far
# above it for any real mistake (a tensor missing or counted twice).
MEGATRON_REL = 2.0 ** -16


@pytest.fixture(scope="module", autouse=True)
def one_rank_group():
    """Megatron's functions all_reduce unconditionally: a 1-process gloo group."""
    with tempfile.TemporaryDirectory() as d:
        dist.init_process_group("gloo", init_method=f"file://{d}/store", rank=0, world_size=1)
        try:
            yield
        finally:
            bm.unpatch()
            dist.destroy_process_group()


def _fp32(seed, count=10):
    return random_tensors(seed, ["float32"], count=count)


def _params(grads, attr="grad"):
    ps = []
    for g in grads:
        p = torch.nn.Parameter(torch.zeros(g.shape, dtype=torch.float32))
        setattr(p, attr, g.clone())
        ps.append(p)
    return ps


def _close(megatron, exact):
    return abs(megatron - exact) <= MEGATRON_REL * exact


# ---- norms ----------------------------------------------------------------

@pytest.mark.parametrize("seed", [0, 1, 2])
def test_norm_p2_vs_megatron(seed):
    grads = _fp32(seed)
    got = bm.get_grad_norm_fp32(grads)
    meg = W.meg_norm(grads)
    assert type(got) is float and type(meg) is float
    assert got == exact_norm(grads, "float64")
    assert _close(meg, got), (meg, got)
    # the same bits in any order and split
    pieces = [p for g in reversed(grads) for p in g.flatten().split(333)]
    assert bm.get_grad_norm_fp32(pieces, 2, dist.group.WORLD) == got


def test_norm_mixed_dtypes_exact():
    grads = random_tensors(5, ["float32", "bfloat16", "float16", "float64"], count=12)
    assert bm.get_grad_norm_fp32(grads) == exact_norm(grads, "float64")
    assert bm.get_grad_norm_fp32(grads, 1) == exact_norm(grads, "float64", 1.0)


def test_norm_inf_same_as_megatron():
    grads = _fp32(7)
    got = bm.get_grad_norm_fp32(grads, INF)
    meg = W.meg_norm(grads, INF)
    assert type(got) is float and got == meg == exact_norm(grads, "float64", INF)
    assert bm.get_grad_norm_fp32(grads, math.inf) == got  # torch.inf / math.inf alike


def test_norm_p1_p3_vs_megatron():
    grads = _fp32(8)
    got1 = bm.get_grad_norm_fp32(grads, 1)
    assert got1 == exact_norm(grads, "float64", 1.0)
    assert _close(W.meg_norm(grads, 1), got1)
    got3 = bm.get_grad_norm_fp32(grads, 3.0)  # deterministic, not exact: within fp32 of Megatron
    assert _close(W.meg_norm(grads, 3.0), got3)


def test_single_tensor_and_empty():
    g = _fp32(9, count=1)[0]
    assert bm.get_grad_norm_fp32(g) == bm.get_grad_norm_fp32([g]) == exact_norm([g], "float64")
    assert bm.get_grad_norm_fp32([]) == 0.0 == W.meg_norm([])
    assert type(bm.get_grad_norm_fp32([])) is float
    assert bm.get_grad_norm_fp32([], INF) == 0.0
    with pytest.raises(ValueError):  # Megatron: max() of an empty sequence
        W.meg_norm([], INF)


def test_megatron_fp32_flavor():
    # megatron-core 0.16.1 has no reproducible (integer-bin) norm option
    # (its clip_grads.py has none): compared with exact_ref's independent
    # implementation of Megatron-LM's definition, and with Megatron's float
    assert "reproducible" not in inspect.getsource(CG).lower()
    grads = random_tensors(11, ["float32", "bfloat16"], count=10)
    got = bm.get_grad_norm_fp32(grads, flavor="megatron_fp32")
    assert type(got) is float and got == exact_megatron(grads)
    assert float(torch.tensor(got, dtype=torch.float32)) == got  # an fp32 value
    fp32 = _fp32(12)
    assert _close(W.meg_norm(fp32), bm.get_grad_norm_fp32(fp32, flavor="megatron_fp32"))


def test_no_fp32_overflow():
    """Megatron squares its fp32 norm in fp32: inf past ~1.8e19."""
    grads = [torch.full((4,), 1e19), torch.full((3,), -2e18)]
    assert W.meg_norm(grads) == INF
    got = bm.get_grad_norm_fp32(grads)
    assert got == exact_norm(grads, "float64") and math.isfinite(got)


def test_nonfinite_like_megatron():
    g = _fp32(13, count=3)
    g[1][0] = INF
    assert bm.get_grad_norm_fp32(g) == INF == W.meg_norm(g)
    g[2][0] = float("nan")
    assert math.isnan(bm.get_grad_norm_fp32(g)) and math.isnan(W.meg_norm(g))


# ---- clipping -------------------------------------------------------------

def _clip_both(grads, max_norm, total, attr="grad"):
    mine, theirs = _params(grads, attr), _params(grads, attr)
    assert bm.clip_grad_by_total_norm_fp32(mine, max_norm, total, attr != "grad") is None
    W.meg_clip(theirs, max_norm, total, attr != "grad")
    return [getattr(p, attr) for p in mine], [getattr(p, attr) for p in theirs]


@pytest.mark.parametrize("attr,dtypes", [("grad", ["float32"]),
                                         ("decoupled_grad", ["float32", "bfloat16"])])
def test_clip_same_bits_as_megatron(attr, dtypes):
    grads = random_tensors(20, dtypes, count=9)
    exact = bm.get_grad_norm_fp32(grads)
    # active, inactive, a coefficient whose fp32 rounding matters, zero, inf, NaN
    for total in (exact, exact / 1e4, 3.0 / 7.0, 1.0 - 2.0 ** -30, 0.0, INF, float("nan")):
        for max_norm in (1.0, 0.3):
            a, b = _clip_both(grads, max_norm, total, attr)
            assert all(same_bits(x, y) for x, y in zip(a, b)), (total, max_norm)
    a, _ = _clip_both(grads, 1.0, exact * 10, attr)
    assert not all(same_bits(x, y) for x, y in zip(a, grads))  # it did clip


def test_clip_skips_missing_grads_and_tensor_arg():
    grads = _fp32(21, count=3)
    ps = _params(grads)
    ps[1].grad = None
    bm.clip_grad_by_total_norm_fp32(ps, 1.0, 100.0)
    ref = _params(grads)
    ref[1].grad = None
    W.meg_clip(ref, 1.0, 100.0)
    assert ps[1].grad is None
    assert same_bits(ps[0].grad, ref[0].grad) and same_bits(ps[2].grad, ref[2].grad)
    one = _params(grads[:1])[0]
    bm.clip_grad_by_total_norm_fp32(one, 1.0, 100.0)  # a tensor, as Megatron accepts
    assert same_bits(one.grad, ref[0].grad)


# ---- bad input: clear errors, nothing modified -------------------------

def test_norm_bad_input():
    g = _fp32(30, count=3)
    with pytest.raises(bitexact.DTypeError, match=r"grads_for_norm\[1\]"):
        bm.get_grad_norm_fp32([g[0], torch.ones(3, dtype=torch.int32), g[2]])
    with pytest.raises(bitexact.InvalidArgumentError, match="norm_type"):
        bm.get_grad_norm_fp32(g, "2")
    with pytest.raises(bitexact.InvalidArgumentError):
        bm.get_grad_norm_fp32(g, float("nan"))
    with pytest.raises(bitexact.InvalidArgumentError, match="flavor"):
        bm.get_grad_norm_fp32(g, flavor="fast")
    with pytest.raises(ValueError, match="Megatron|MEGATRON"):
        bm.get_grad_norm_fp32(g, INF, flavor="megatron_fp32")


def test_clip_bad_input_changes_nothing():
    grads = _fp32(31, count=4)
    ps = _params(grads)
    half = torch.nn.Parameter(torch.zeros(grads[2].shape, dtype=torch.float16))
    half.grad = grads[2].half()
    before = [p.grad.clone() for p in ps]
    with pytest.raises(bitexact.DTypeError, match=r"parameters\[2\]\.grad is torch\.float16"):
        bm.clip_grad_by_total_norm_fp32(ps[:2] + [half] + ps[3:], 1.0, 1e6)
    assert same_bits(half.grad, grads[2].half())
    for bad in (dict(max_norm=-1.0, total_norm=1e6), dict(max_norm=float("nan"), total_norm=1e6),
                dict(max_norm=1.0, total_norm=-5.0)):
        with pytest.raises(bitexact.InvalidArgumentError):
            bm.clip_grad_by_total_norm_fp32(ps, **bad)
    dup = torch.nn.Parameter(torch.zeros_like(ps[0]))
    dup.grad = ps[0].grad  # the same tensor twice: cannot be scaled once each
    with pytest.raises(bitexact.LayoutError, match=r"parameters\[0\].*parameters\[4\]|"
                                                   r"parameters\[4\].*parameters\[0\]"):
        bm.clip_grad_by_total_norm_fp32(ps + [dup], 1.0, 1e6)
    assert all(same_bits(p.grad, b) for p, b in zip(ps, before))


# ---- patch() / unpatch() on real Megatron optimizers -----------------------

def _originals():
    return (CG.get_grad_norm_fp32, CG.clip_grad_by_total_norm_fp32, OPT.get_grad_norm_fp32,
            OPT.clip_grad_by_total_norm_fp32, LW.get_grad_norm_fp32,
            OPT.ChainedOptimizer.__dict__["get_grad_norm"])


def test_patch_everywhere_and_unpatch():
    orig = _originals()
    assert orig[0] is W.MEG_NORM and bm.is_patched() is None
    with bm.patch(flavor="megatron_fp32") as handle:
        assert handle is not None and bm.is_patched() == "megatron_fp32"
        now = _originals()
        assert all(a is not b for a, b in zip(now, orig))
        assert now[0] is now[2] is now[4] and now[1] is now[3]
        for fn, ref in ((now[0], orig[0]), (now[1], orig[1])):
            assert inspect.signature(fn) == inspect.signature(ref)
        # a module importing by name after patch() gets the patched one ...
        late = types.ModuleType("megatron.bitexact_test_late")
        sys.modules[late.__name__] = late
        exec("from megatron.core.optimizer.clip_grads import get_grad_norm_fp32", late.__dict__)
        assert late.get_grad_norm_fp32 is now[0]
        grads = random_tensors(40, ["float32", "bfloat16"], count=6)
        assert OPT.get_grad_norm_fp32(grads) == exact_megatron(grads)
        bm.patch()  # switches the flavour
        assert bm.is_patched() == "exact" and OPT.get_grad_norm_fp32(grads) == exact_norm(grads)
    # ... and Megatron's own again after unpatch()
    assert _originals() == orig and bm.is_patched() is None
    assert late.get_grad_norm_fp32 is orig[0]
    del sys.modules[late.__name__]
    bm.unpatch()  # a no-op


def test_patch_bad_flavor_patches_nothing():
    with pytest.raises(bitexact.InvalidArgumentError, match="flavor"):
        bm.patch(flavor="fp16")
    assert _originals()[0] is W.MEG_NORM and bm.is_patched() is None


def _tiny_model(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LayerNorm(32),
                                torch.nn.Linear(32, 8))
    model(torch.randn(64, 16)).square().mean().backward()
    return model


def _fp32_opt(model, clip):
    cfg = OPT.OptimizerConfig(optimizer="adam", lr=1e-2, clip_grad=clip)
    with W.CudaOnCpu():
        opt = OPT.FP32Optimizer(torch.optim.Adam(model.parameters(), lr=1e-2), cfg, lambda o: None)
    opt.grad_stats_parallel_group = dist.group.WORLD
    opt.tp_group = dist.new_group([0])
    return opt


def test_fp32_optimizer_step_patched():
    """A real FP32Optimizer(Adam): patched, get_grad_norm and step() use the
    exact norm and clip as Megatron's own clip does for that norm."""
    model = _tiny_model(0)
    grads = [p.grad.clone() for p in model.parameters()]
    exact = exact_norm(grads, "float64")
    ref = _params(grads)
    W.meg_clip(ref, 0.01, exact)
    opt = _fp32_opt(model, 0.01)
    unpatched = opt.get_grad_norm  # Megatron's (needs its 'cuda' buffers)
    with W.CudaOnCpu():
        assert _close(unpatched(), exact)
    with bm.patch():
        assert opt.get_grad_norm() == exact
        ok, norm, zeros = opt.step()
    assert ok is True and norm == exact and zeros is None
    assert all(same_bits(p.grad, r.grad) for p, r in zip(model.parameters(), ref))


def test_chained_optimizer_dense_expert_one_process():
    """Dense and expert optimizers with different grad stats groups: Megatron
    combines sqrt(a**2 + b**2) of two rounded norms; patched, the exact sum."""
    dense, expert = _tiny_model(1), _tiny_model(2)
    d, e = _fp32_opt(dense, 0.02), _fp32_opt(expert, 0.02)
    e.grad_stats_parallel_group = dist.new_group([0])
    chained = OPT.ChainedOptimizer([d, e])
    assert not chained.grads_states_parallel_group_is_shared()
    grads = [p.grad.clone() for m in (dense, expert) for p in m.parameters()]
    exact = exact_norm(grads, "float64")
    assert _close(W.meg_chained_norm(chained), exact)
    with bm.patch():
        assert chained.get_grad_norm() == exact
        ok, norm, _ = chained.step()
    assert ok and norm == exact
    ref = _params(grads)
    W.meg_clip(ref, 0.02, exact)
    got = [p.grad for m in (dense, expert) for p in m.parameters()]
    assert all(same_bits(a, r.grad) for a, r in zip(got, ref))


def test_chained_refuses_unknown_sub_optimizer():
    class Custom(OPT.FP32Optimizer):
        def get_grad_norm(self):
            return 1.0
    model = _tiny_model(3)
    a = _fp32_opt(model, 1.0)
    b = _fp32_opt(_tiny_model(4), 1.0)
    b.__class__ = Custom
    b.grad_stats_parallel_group = dist.new_group([0])
    with pytest.raises(bitexact.InvalidArgumentError, match=r"chained_optimizers\[1\] \(Custom\)"):
        bm.chained_grad_norm(OPT.ChainedOptimizer([a, b]))


# ---- two gloo ranks: dense and expert groups, against one process ----------

@pytest.fixture(scope="module")
def runs():
    """The worker's scenarios on 1 process (the reference) and on 2."""
    out = {}
    for ws in (1, 2):
        with tempfile.TemporaryDirectory() as d:
            mp.spawn(W.main, args=(ws, d), nprocs=ws, join=True)
            out[ws] = [torch.load(os.path.join(d, f"rank{r}.pt"), weights_only=False)
                       for r in range(ws)]
    return out


def _get(res, name):
    for r, o in enumerate(res):
        assert "exception" not in o[name], f"rank {r}:\n{o[name]['exception']}"
    return [o[name] for o in res]


def test_two_ranks_sharded_norms(runs):
    everything = W.dense_grads() + W.expert_grads()
    want = {"exact2": exact_norm(everything), "exact1": exact_norm(everything, "float64", 1.0),
            "exactinf": exact_norm(everything, "float64", INF),
            "megatron_fp32": exact_megatron(everything)}
    for ws in (1, 2):
        for r, o in enumerate(_get(runs[ws], "shards")):
            for k, v in want.items():
                assert o[k] == v, (ws, r, k)
            assert o["empty1"] == want["exact2"]
            assert o["megatron_inf"] == want["exactinf"]
            assert _close(o["megatron"], want["exact2"])


@pytest.mark.parametrize("kind", ["ep", "tp"])
def test_two_ranks_dense_expert_groups(runs, kind):
    """ep: TP=1, EP=2 (dense grad stats group: this rank; expert: both);
    tp: TP=2, expert TP=1 (dense: both; expert: this rank). Megatron's
    parallel_state builds the groups; patched, every rank's norm and
    clipped gradients are bitwise the 1-process run's."""
    dense, experts = W.dense_grads(), W.expert_grads()
    exact = exact_norm(dense + experts)
    one = _get(runs[1], kind)[0]
    assert one["exact"] == one["step"][1] == exact and one["step"][0] is True
    assert one["megatron_fp32"] == exact_megatron(dense + experts)
    nd = len(dense)
    for r, o in enumerate(_get(runs[2], kind)):
        assert o["shared"] is False  # the float-combining branch of Megatron
        assert o["exact"] == exact and o["step"] == (True, exact), r
        assert o["megatron_fp32"] == one["megatron_fp32"]
        assert _close(o["megatron"], exact)
        ref_dense, ref_exp = one["grads"][:nd], one["grads"][nd:]
        if kind == "ep":
            want = ref_dense + ref_exp[r::2]
        else:
            want = [torch.tensor_split(g, 2, dim=0)[r] if g.dim() >= 2 else g
                    for g in ref_dense] + ref_exp
        assert len(o["grads"]) == len(want)
        assert all(same_bits(a, b) for a, b in zip(o["grads"], want)), r


def test_two_ranks_dtensor_grads(runs):
    """DTensor gradients (Megatron FSDP): reduced over their mesh's group,
    then the grad stats group, as Megatron does."""
    dense = W.dense_grads()
    for ws in (1, 2):
        for r, o in enumerate(_get(runs[ws], "dtensor")):
            assert o["exact"] == exact_norm(dense), (ws, r)
            assert o["exactinf"] == exact_norm(dense, "float64", INF) == o["megatron_inf"]
            assert _close(o["megatron"], o["exact"])


def test_two_ranks_bad_input_raises_everywhere(runs):
    out = _get(runs[2], "errors")
    assert out[1]["type"] == "DTypeError" and "grads_for_norm[1]" in out[1]["msg"]
    assert out[0]["type"] is not None and out[0]["rank"] == 1, out[0]  # the rank at fault
