"""SpecForge 0.2.0 (PyPI) training with bitexact's gradient norm, on the CPU
with gloo, 2 processes (issue 24). specforge_worker.py runs SpecForge's own
code: the EAGLE3 draft (LlamaForCausalLMEagle3 with its frozen embedding)
in OnlineEagle3Model, Eagle3TrainStrategy, TrainerCore, FSDPTrainingBackend
(FSDP1, use_orig_params, bf16 MixedPrecision; DDP for NO_SHARD) and
BF16Optimizer (fp32 masters, AdamW), for one step, with
BF16Optimizer._grad_norm_and_clip_coefficient monkeypatched to bitexact:

- patch "norm": bitexact.torch.get_total_norm over the bf16 gradients with
  norm_dtype=torch.float32 and SpecForge's configured process group (WORLD
  from ParallelConfig.from_distributed), then SpecForge's own coefficient
  and fp32 master path;
- patch "fsdp_args": the same with **bitexact.torch.fsdp_norm_args(the
  wrapped root) instead of SpecForge's group (docs/python.md's example),
  with a hand-built ParallelConfig whose group is None;
- patch "clip": bitexact.torch.clip_grad_norm_ over the FSDP parameters,
  SpecForge's process group passed through as it is. With None (a
  hand-built ParallelConfig) bitexact refuses the FSDP1 shards by name on
  every rank, nothing scaled (asserted; the global norm would pass too).

Checked, bit for bit: the norm and coefficient are the same on both ranks
and equal the exact norm of all ranks' gradients (tests/python/exact_ref.py)
and the result of the same SpecForge optimizer step run in this (one,
non-distributed) process on the gathered parameters and gradients; the
clipped fp32 master gradients, the masters and the bf16 weights after
AdamW equal that one-process run. Negative controls: SpecForge's stock norm
on the same gradients (measured, and its masters compared where its
coefficient differs), a one-ulp change of the coefficient is caught by the
master comparison, and a rank-local norm (the seed bug) is caught by the
norm comparison. Also issue 24's defects directly: a rank holding no
gradient with bf16/fp16 gradients elsewhere (defect 1), FSDP1 shards with
no process group (defect 2), norm_dtype (defect 3).

Installation: scripts/clients_setup.sh installs specforge==0.2.0 with
--no-deps; the modules used here import with the packages py_setup.sh pins
(transformers 5.24.0, numpy, safetensors, ...). On the CPU, three stand-ins
a user would need too (none touches the gradient reduction, the norm or
the optimizer): FSDP1 gets device_id=cpu (FSDPTrainingBackend passes
none), the GPU-only Triton LogSoftmaxLoss is replaced by SpecForge's own
reference implementation (specforge.core.loss._compute_loss), and
torch.compile is disabled (dynamo off) so the run stays short.

Runtime: about 30-45 s on 2 cores (one spawn of 2 workers for every case)."""
import math
import os
import sys

import pytest
import torch

pytest.importorskip("specforge", reason="specforge is installed by scripts/clients_setup.sh")


_HERE = os.path.dirname(os.path.abspath(__file__))
for _d in (_HERE, os.path.dirname(_HERE)):
    if _d not in sys.path:
        sys.path.insert(0, _d)

import specforge_worker as W  # noqa: E402
from exact_ref import exact_norm  # noqa: E402
from helpers import FMT, needs_gloo, rank_results, same_bits, spawn_ranks  # noqa: E402

pytestmark = needs_gloo()
WS = 2


@pytest.fixture(scope="module")
def ranks():
    return spawn_ranks(W.main, WS)


_get = rank_results



def _value(res, what):
    assert "error" not in res, f"{what}: {res['error']}\n{res['traceback']}"
    return res["value"]


def _assert_refusal(msg, where):
    assert msg is not None, f"{where}: not refused while another rank was"
    assert "process_group" in msg and "fsdp_norm_args" in msg, f"{where}: {msg}"


def _global_or_refused(res, want, where):
    """A call with process_group=None over FSDP1 shards: the global norm
    (want) or a refusal naming the fix; never a shard's norm."""
    if "error" in res:
        assert res["error"].startswith("InvalidArgumentError"), f"{where}: {res['error']}"
        _assert_refusal(res["error"], where)
        return "refused"
    assert float(res["value"]) == want, f"{where}: {float(res['value'])!r} != global {want!r}"
    return "global"


def _present(ts):
    return [t for t in ts if t is not None]


def _flat(t, dtype):
    return torch.empty(0, dtype=dtype) if t is None else t.reshape(-1)


def _gathered(outs, key, i, dtype):
    """Parameter i's pieces of every rank, concatenated in rank order (FSDP1
    shards are contiguous ranges of the flat parameter, rank 0 first); a
    DDP replica is rank 0's."""
    if outs[0]["wrapper"] == "ddp":
        return _flat(outs[0][key][i], dtype)
    return torch.cat([_flat(o[key][i], dtype) for o in outs])


def _counted_grads(outs):
    if outs[0]["wrapper"] == "ddp":
        return _present(outs[0]["grads"])
    return [g for o in outs for g in _present(o["grads"])]


def _coef_of(norm):
    return torch.clamp(W.MAX_GRAD_NORM / (norm + 1e-6), max=1.0)


def one_process(case, outs):
    """The same SpecForge optimizer step, with the same patch, in this
    process alone on the gathered parameters and gradients."""
    n = len(outs[0]["names"])
    module = torch.nn.Module()
    module.params = torch.nn.ParameterList(
        [torch.nn.Parameter(_gathered(outs, "params_before", i, torch.bfloat16)
                            .view(outs[0]["shapes"][i])) for i in range(n)])
    with W.patched(case["patch"]):
        opt = W.make_optimizer(module)
        assert not torch.distributed.is_initialized()
        for i, p in enumerate(opt.model_params):
            p.grad = _gathered(outs, "grads", i, torch.bfloat16).view(p.shape).clone()
        rec = {}
        W.record_adamw_grads(opt, rec)
        inner = opt._grad_norm_and_clip_coefficient

        def keep():
            rec["norm"], rec["coef"] = inner()
            return rec["norm"], rec["coef"]
        opt._grad_norm_and_clip_coefficient = keep
        opt.step()
    rec["masters_after"] = [m.detach().reshape(-1) for m in opt.fp32_params]
    rec["params_after"] = [p.detach().reshape(-1) for p in opt.model_params]
    rec["master_grads"] = [g.reshape(-1) for g in rec["master_grads"]]
    return rec


def _pieces(outs, r, key, i, dtype):
    """(rank r's piece of parameter i, its offset in the full parameter)."""
    if outs[0]["wrapper"] == "ddp":
        return _flat(outs[r][key][i], dtype), 0
    off = sum(_flat(outs[q]["params_before"][i], torch.bfloat16).numel() for q in range(r))
    return _flat(outs[r][key][i], dtype), off


def _assert_pieces_match(outs, ref, key, dtype):
    for r in range(WS):
        for i, name in enumerate(outs[0]["names"]):
            piece, off = _pieces(outs, r, key, i, dtype)
            if piece.numel() == 0:
                continue
            want = ref[key][i][off:off + piece.numel()]
            assert same_bits(piece, want), f"rank {r}, {name}: {key} differ from one process"


@pytest.mark.parametrize("case", W.SPECFORGE_CASES, ids=W.case_id)
def test_specforge_step(ranks, case, record_property):
    outs = _get(ranks, ("specforge", W.case_id(case)))
    o0 = outs[0]
    if any("refused" in o for o in outs):
        # process_group=None over FSDP1 shards: refused by name on every rank
        # (issue 24: "use the FSDP process group, or refuse"), nothing scaled
        assert case["patch"] == "clip" and case["group"] == "manual"
        for r, o in enumerate(outs):
            _assert_refusal(o.get("refused"), f"rank {r}")
            for g, h in zip(o["grads"], o["grads_after_refusal"]):
                assert (g is None and h is None) or same_bits(g, h), f"rank {r}"
        return
    assert all(o["is_bf16_optimizer"] for o in outs)
    assert o0["wrapper"] == ("ddp" if case["strategy"] == "NO_SHARD" else "fsdp")
    assert o0["group_is_none"] == (case["group"] == "manual")
    for r, o in enumerate(outs):
        assert {g.dtype for g in _present(o["grads"])} <= {torch.bfloat16}, f"rank {r}"
    if case["layout"] == "rank0_empty":  # the frozen embedding fills rank 0's shard
        assert not _present(outs[0]["grads"]) and _present(outs[1]["grads"])
    elif o0["wrapper"] == "fsdp":
        assert all(_present(o["grads"]) for o in outs)
    else:  # DDP: replicas, counted once (SpecForge disables its reduction)
        assert not o0["reduce"]
        assert all(same_bits(a, b) for a, b in zip(outs[0]["grads"], outs[1]["grads"]))

    grads = _counted_grads(outs)
    exact = exact_norm(grads, "float32")
    ref = one_process(case, outs)
    # the norm: fp32, exact, the same bits on every rank and in one process
    assert ref["norm"].dtype == torch.float32 and float(ref["norm"]) == exact
    for r, o in enumerate(outs):
        assert o["norm"].dtype == torch.float32, f"rank {r}: {o['norm'].dtype}"
        assert float(o["norm"]) == exact, f"rank {r}: {float(o['norm'])!r} != exact {exact!r}"
        assert same_bits(o["norm"], ref["norm"]) and same_bits(o["last_grad_norm"], o["norm"])
    # the coefficient: SpecForge's formula on the exact norm, clipping active
    coef = _coef_of(torch.tensor(exact, dtype=torch.float32))
    assert float(coef) < 1.0
    for r, o in enumerate(outs):
        want = torch.ones((), dtype=torch.float32) if case["patch"] == "clip" else coef
        assert same_bits(o["coef"], want) and same_bits(ref["coef"], want), f"rank {r}"
    # clipped fp32 masters, masters and bf16 weights after AdamW: one process's
    _assert_pieces_match(outs, ref, "master_grads", torch.float32)
    _assert_pieces_match(outs, ref, "masters_after", torch.float32)
    _assert_pieces_match(outs, ref, "params_after", torch.bfloat16)
    for r, o in enumerate(outs):  # clipping and the step did something
        for i, g in enumerate(o["grads"]):
            if g is not None and g.numel():
                assert not torch.equal(o["master_grads"][i], g.float()), f"rank {r}: not clipped"
                assert not torch.equal(o["masters_after"][i], o["masters_before"][i])

    # negative controls
    stock_norm, stock_coef = outs[0]["stock"]
    for o in outs:  # stock SpecForge: one value on every rank, near the exact one
        assert same_bits(o["stock"][0], stock_norm)
    assert math.isclose(float(stock_norm), exact, rel_tol=1e-5)
    record_property("exact_norm", exact.hex())
    record_property("stock_norm", float(stock_norm).hex())
    record_property("exact_coef", float(coef).hex())
    record_property("stock_coef", float(stock_coef).hex())
    print(f"\n{W.case_id(case)}: exact norm {exact!r} ({exact.hex()}), stock {float(stock_norm)!r}"
          f" ({float(stock_norm).hex()}); coefficient exact {float(coef)!r}, "
          f"stock {float(stock_coef)!r}")
    # a small error of the coefficient is caught by the master-gradient
    # comparison: one fp32 ulp where SpecForge multiplies the fp32 masters,
    # 2^-7 relative where the bf16 gradients are scaled (bf16's resolution);
    # and the stock coefficient, where it differs
    if case["patch"] != "clip":
        wrong = [torch.nextafter(coef, torch.tensor(0.0))]
    else:
        wrong = [coef * (1 - 2.0 ** -7)]
    if not same_bits(stock_coef, coef):
        wrong.append(stock_coef)
    for c in wrong:
        caught = False
        for r, o in enumerate(outs):
            for i, g in enumerate(o["grads"]):
                if g is None or not g.numel():
                    continue
                if case["patch"] != "clip":  # SpecForge: fp32(g) * coef
                    alt = g.float() * c
                else:  # torch's scaling of bf16 gradients: in fp32, rounded to bf16
                    alt = (g.float() * c).to(torch.bfloat16).float()
                caught |= not same_bits(alt.reshape(-1), o["master_grads"][i].reshape(-1))
        assert caught, f"coefficient {float(c)!r} would not be detected"


def _direct_cases():
    return [c for c in W.SPECFORGE_CASES if c["direct"]]


@pytest.mark.parametrize("case", _direct_cases(), ids=W.case_id)
def test_defects_on_specforge_shards(ranks, case):
    """Issue 24's calls on the real FSDP1 shards of SpecForge's draft, before
    the step: defect 1 (torch's default dtype, bf16, agreed although a rank
    may hold nothing), defect 2 (no group: the FSDP group's norm), defect 3
    (norm_dtype as a string); the rank-local norm as a negative control."""
    outs = _get(ranks, ("specforge", W.case_id(case)))
    grads = _counted_grads(outs)
    exact32, exact16 = exact_norm(grads, "float32"), exact_norm(grads, "bfloat16")
    for key, fmt in (("d1_get_total_norm", "bfloat16"), ("d1_clip_huge", "bfloat16"),
                     ("d3_str", "float32"), ("d2_fsdp_args", "float32")):
        vals = [_value(o[key], f"rank {r} {key}") for r, o in enumerate(outs)]
        want = exact16 if fmt == "bfloat16" else exact32
        for r, v in enumerate(vals):
            assert FMT[v.dtype] == fmt, f"rank {r} {key}: {v.dtype}"
            assert float(v) == want, f"rank {r} {key}: {float(v)!r} != exact {want!r}"
            assert same_bits(v, vals[0])
    # defect 2: no group over FSDP1 shards. clip_grad_norm_ sees the
    # parameters on every rank: the global norm or a refusal, the same on
    # all ranks. get_total_norm sees only gradients: a rank holding none
    # cannot tell (it returns 0 alone), but then a rank holding shards refuses
    seen = [_global_or_refused(o["d2_clip_none"], exact32, f"rank {r} clip_grad_norm_")
            for r, o in enumerate(outs)]
    assert len(set(seen)) == 1, f"clip_grad_norm_(process_group=None): ranks disagree {seen}"
    seen = []
    for r, o in enumerate(outs):
        res = o["d2_get_total_norm_none"]
        if not _present(o["grads"]) and "value" in res:
            assert float(res["value"]) == 0.0
            seen.append("empty")
        else:
            seen.append(_global_or_refused(res, exact32, f"rank {r} get_total_norm"))
    assert set(seen) in ({"global"}, {"refused"}, {"empty", "refused"}), seen
    print(f"\n{W.case_id(case)}: process_group=None: clip_grad_norm_ "
          f"{_global_or_refused(outs[0]['d2_clip_none'], exact32, '')}, get_total_norm {seen}")
    # defect 3's point: the bf16 norm (torch's default dtype for bf16
    # gradients) gives another coefficient than SpecForge's fp32 one
    c16 = _coef_of(_value(outs[0]["d1_get_total_norm"], "bf16"))
    c32 = _coef_of(_value(outs[0]["d3_str"], "fp32"))
    assert float(c16) != float(c32)
    print(f"\n{W.case_id(case)}: coefficient from the bf16 norm {float(c16)!r}, "
          f"from the fp32 norm {float(c32)!r}")
    for r, o in enumerate(outs):  # max_norm 1e30: coefficient 1, nothing scaled
        for g, h in zip(o["grads"], o["grads_after_direct"]):
            assert (g is None and h is None) or same_bits(g, h), f"rank {r}"
    # the seed bug: each rank's own shard norm; not the global one on some rank
    local = [float(o["shard_norm"]) for o in outs]
    for r, o in enumerate(outs):
        assert local[r] == exact_norm(_present(o["grads"]), "float32")
    assert any(v != exact32 for v in local), (local, exact32)
    print(f"\n{W.case_id(case)}: shard norms {local} vs global {exact32!r}")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_empty_rank_low_precision(ranks, dtype):
    """Defect 1 without FSDP: rank 0 holds bf16/fp16 gradients, rank 1 none
    (and a parameter without grad): both get the norm in the gradients'
    dtype, the exact one; clip_grad_norm_ scales rank 0's gradients as
    torch's clip_grads_with_norm_ does with that norm."""
    outs = _get(ranks, ("empty_rank", str(dtype)))
    grads = outs[0]["grads"]
    assert grads and not outs[1]["grads"]
    want = exact_norm(grads, FMT[dtype])
    for key in ("get_total_norm", "clip"):
        vals = [_value(o[key], f"rank {r} {key}") for r, o in enumerate(outs)]
        for r, v in enumerate(vals):
            assert v.dtype == dtype, f"rank {r} {key}: {v.dtype}"
            assert float(v) == want and same_bits(v, vals[0]), f"rank {r} {key}"
    params = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
    for p, g in zip(params, grads):
        p.grad = g.clone()
    torch.nn.utils.clip_grads_with_norm_(params, 0.5, _value(outs[0]["clip"], "clip"))
    assert float(_value(outs[0]["clip"], "clip")) > 0.5  # clipping was active
    for p, c in zip(params, outs[0]["clipped"]):
        assert same_bits(p.grad, c)
    for r, o in enumerate(outs):
        v = _value(o["fp32"], f"rank {r} fp32")
        assert v.dtype == torch.float32 and float(v) == exact_norm(grads, "float32")


@pytest.mark.parametrize("case", W.FSDP_DIRECT, ids=lambda c: f"{c[0]}-orig{int(c[1])}")
def test_fsdp1_no_group(ranks, case):
    """Defect 2 without SpecForge: FSDP1 gradients (flat parameters, or
    use_orig_params views) with no process group give the norm over the
    FSDP group or are refused by name, never a shard's norm; with
    fsdp_norm_args(model) the same bits as the explicit group with owned=
    (NO_SHARD replicas counted once)."""
    strategy, _ = case
    outs = _get(ranks, ("fsdp_direct", case))
    counted = outs[0]["grads"] if strategy == "NO_SHARD" else [g for o in outs for g in o["grads"]]
    want = exact_norm(counted, "float32")
    for r, o in enumerate(outs):
        world = _value(o["world"], f"rank {r} process_group=WORLD")
        args = _value(o["fsdp_args"], f"rank {r} fsdp_norm_args")
        assert float(world) == want, f"rank {r}: the explicit group is not exact"
        assert same_bits(args, world), f"rank {r}: fsdp_norm_args {float(args)!r}"
        if strategy == "NO_SHARD":  # replicas: this process alone is the whole model
            assert same_bits(_value(o["none"], f"rank {r} None"), world)
        else:
            _global_or_refused(o["none"], want, f"rank {r} process_group=None")
        for g, h in zip(o["grads"], o["grads_after"]):
            assert same_bits(g, h), f"rank {r}: max_norm 1e30 scaled a gradient"
    if strategy != "NO_SHARD":  # negative control: a shard's norm is not it
        assert any(exact_norm(o["grads"], "float32") != want for o in outs)
