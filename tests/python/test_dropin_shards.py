"""Issue 24's defects of the torch drop-ins, on 2 gloo ranks
(dropin_worker.py) and in this process:

1. a rank holding no gradient (or other dtypes) gets the norm dtype torch's
   promotion gives over all ranks (chosen by the library, agreed in its
   agreement step), not a MismatchError;
2. FSDP1 flat-parameter shards with process_group=None are refused by name
   (never a rank-local norm of shards); fsdp_norm_args(model) gives the
   exact global norm on every rank, also when a rank's shard holds no
   gradient;
3. norm_dtype= on get_total_norm / clip_grad_norm_ (eager and compiled);
   ranks asking for different dtypes get a message naming both dtypes."""

import pytest
import torch

import bitexact
import bitexact.torch as bt
import dropin_worker as W
from exact_ref import exact_norm
from helpers import FMT, random_tensors, needs_gloo, rank_results, same_bits, spawn_ranks

pytestmark = needs_gloo()
WS = 2


@pytest.fixture(scope="module")
def ranks():
    return spawn_ranks(W.main, WS)


_get = rank_results



def _same_everywhere(values):
    for r, v in enumerate(values):
        assert same_bits(v, values[0]), f"rank {r}: {v!r} != rank 0's {values[0]!r}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_rank_without_gradients(ranks, dtype):
    """Defect 1: bf16/fp16 gradients on rank 0, none on rank 1: both ranks
    return the exact norm in the gradients' dtype (was MismatchError)."""
    outs = [o[str(dtype)] for o in _get(ranks, "empty_rank")]
    exact = exact_norm(outs[0]["pieces"], FMT[dtype])
    for key in ("total", "clipped"):
        _same_everywhere([o[key] for o in outs])
        assert outs[0][key].dtype == dtype
        assert float(outs[0][key]) == exact
    # rank 0's gradients clipped as torch clips them with that norm
    want = [g.clone() for g in W._grads(1, dtype)]
    torch.nn.utils.clip_grads_with_norm_([torch.nn.Parameter(g) for g in want], 1.0,
                                         outs[0]["total"])
    ref = [torch.nn.Parameter(torch.zeros_like(g)) for g in want]
    for p, g in zip(ref, W._grads(1, dtype)):
        p.grad = g.clone()
    torch.nn.utils.clip_grads_with_norm_(ref, 1.0, outs[0]["total"])
    for k, (p, g) in enumerate(zip(ref, outs[0]["grads"])):
        assert same_bits(p.grad, g), f"gradient {k}"
    assert outs[1]["grads"] == []


def test_mixed_dtypes_over_ranks(ranks):
    """bf16 on one rank, fp16 on the other: fp32 on both (torch's promotion
    of the whole set)."""
    outs = _get(ranks, "mixed")
    _same_everywhere([o["total"] for o in outs])
    assert outs[0]["total"].dtype == torch.float32
    assert float(outs[0]["total"]) == exact_norm(outs[0]["pieces"], "float32")


def test_norm_dtype_multi_rank(ranks):
    """Defect 3 over ranks: fp32 and fp64 norms of bf16 gradients (rank 0
    empty), and a named refusal when the ranks ask for different dtypes."""
    outs = _get(ranks, "norm_dtypes")
    for key, dtype in ((str(torch.float32), torch.float32), ("float64", torch.float64)):
        _same_everywhere([o[key] for o in outs])
        assert outs[0][key].dtype == dtype
        assert float(outs[0][key]) == exact_norm(outs[0]["pieces"], FMT[dtype])
    for r, o in enumerate(outs):
        msg = o["mismatch"]
        assert msg is not None, f"rank {r}: no MismatchError"
        assert "norm_dtype" in msg and "float32" in msg and "bfloat16" in msg, msg
        assert "smallest" not in msg, msg  # names, not enum codes


@pytest.mark.parametrize("case", W.FSDP_CASES, ids=W.fsdp_case)
def test_fsdp1_shards(ranks, case):
    """Defect 2: FSDP1 shards with process_group=None are refused by name
    (NO_SHARD replicas: the local norm is the global one, allowed);
    fsdp_norm_args gives the exact global norm on every rank."""
    outs = _get(ranks, ("fsdp1", W.fsdp_case(case)))
    strategy, _, freeze, dtype = case
    dtype = dtype or torch.float32
    exact = exact_norm(outs[0]["pieces"], FMT[dtype])
    for key in ("norm_args", "clip_args"):
        _same_everywhere([o[key] for o in outs])
        assert outs[0][key].dtype == dtype
        assert float(outs[0][key]) == exact
    _same_everywhere([o["norm_fp32"] for o in outs])
    assert float(outs[0]["norm_fp32"]) == exact_norm(outs[0]["pieces"], "float32")
    if freeze:  # the frozen embedding fills rank 0's shard
        assert outs[0]["ngrads"] == 0 and outs[1]["ngrads"] > 0
    for r, o in enumerate(outs):
        for key in ("clip_none", "norm_none"):
            if strategy == "NO_SHARD":
                assert same_bits(o[key], outs[0]["norm_args"]), (r, key)
            elif key == "norm_none" and o["ngrads"] == 0:
                # get_total_norm([]) cannot know: torch's tensor(0.) (the
                # ranks holding shards refuse)
                assert float(o[key]) == 0.0
            else:
                assert isinstance(o[key], str), f"rank {r}, {key}: not refused: {o[key]!r}"
                assert "FSDP1" in o[key] and "fsdp_norm_args" in o[key], o[key]


def test_norm_dtype_one_process():
    """norm_dtype= without a group: the norm rounded once into the dtype
    asked for; clip_grad_norm_'s coefficient follows it (torch's ops)."""
    grads = random_tensors(7, ["bfloat16"], count=6)
    for nd, fmt in ((torch.float32, "float32"), ("float64", "float64"),
                    (torch.bfloat16, "bfloat16"), (None, "bfloat16"), ("grads", "bfloat16")):
        total = bt.get_total_norm(grads, norm_dtype=nd)
        assert total.dtype == FMT.get(fmt) or str(total.dtype) == "torch." + fmt
        assert float(total) == exact_norm(grads, fmt), nd
    params = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
    ref = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
    for p, q, g in zip(params, ref, grads):
        p.grad, q.grad = g.clone(), g.clone()
    total = bt.clip_grad_norm_(params, 0.5, norm_dtype=torch.float32)
    assert total.dtype == torch.float32 and float(total) == exact_norm(grads, "float32")
    torch.nn.utils.clip_grads_with_norm_(ref, 0.5, total)  # fp32 coefficient, as torch
    for k, (p, q) in enumerate(zip(params, ref)):
        assert same_bits(p.grad, q.grad), k
    assert bt.get_total_norm([], norm_dtype=torch.float64).dtype == torch.float64
    with pytest.raises(bitexact.InvalidArgumentError, match="norm_dtype"):
        bt.get_total_norm(grads, norm_dtype="int8")


def test_norm_dtype_compiled():
    """The custom ops carry norm_dtype: a compiled call equals eager."""
    grads = random_tensors(8, ["bfloat16"], count=3)

    def f(gs):
        return bt.get_total_norm(gs, norm_dtype=torch.float32)
    got = torch.compile(f, fullgraph=True)(grads)
    assert same_bits(got, f(grads)) and got.dtype == torch.float32
