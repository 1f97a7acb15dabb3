"""torch.distributed (gloo, CPU) with 2 and 4 processes: DDP-style
replicas, a hand-sharded model, Megatron-like TP duplicates, FSDP2 (and
HSDP on 4): every rank's norm is bitwise the single-process unsharded norm
and the clipped gradients are the single-process clipped gradients."""
import os
import tempfile

import pytest
import torch
import torch.multiprocessing as mp

import bitexact.torch as bt
import dist_worker as W
from exact_ref import exact_norm
from helpers import FMT, params_with_grads, same_bits

pytestmark = pytest.mark.skipif(not torch.distributed.is_available()
                                or not torch.distributed.is_gloo_available(),
                                reason="torch.distributed with gloo is not available")


@pytest.fixture(scope="module", params=[2, 4], ids=lambda n: f"{n}ranks")
def ranks(request):
    """Run every scenario once on n processes; the per-rank results."""
    ws = request.param
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(W.main, args=(ws, d), nprocs=ws, join=True)
        res = [torch.load(os.path.join(d, f"rank{r}.pt"), weights_only=False)
               for r in range(ws)]
    return ws, res


def _get(res, name):
    out = [r[name] for r in res]
    for r, o in enumerate(out):
        assert not (isinstance(o, dict) and "exception" in o), f"rank {r}:\n{o['exception']}"
    return out


def _single_clip(grads):
    """The single-process, unsharded reference: norm and clipped grads."""
    ps = params_with_grads(grads)
    total = bt.clip_grad_norm_(ps, W.MAX_NORM)
    assert float(total) == exact_norm(grads, FMT[total.dtype])
    return total, [p.grad for p in ps]


def test_ddp_replicas(ranks):
    ws, res = ranks
    total, clipped = _single_clip(W.ddp_data())
    for r, o in enumerate(_get(res, "ddp")):
        assert same_bits(o["total"], total), f"rank {r}"
        assert all(same_bits(a, b) for a, b in zip(o["grads"], clipped)), f"rank {r}"


def test_hand_sharded(ranks):
    ws, res = ranks
    full, pieces = W.shard_pieces()
    total, clipped = _single_clip(pieces)
    out = _get(res, "sharded")
    for r, o in enumerate(out):
        assert same_bits(o["total"], total), f"rank {r}"
        assert all(same_bits(a, b) for a, b in zip(o["grads"], clipped[r::ws])), f"rank {r}"
    # and the pieces' norm is the whole tensors' norm
    assert same_bits(bt.get_total_norm(full), total)


def test_tensor_parallel_duplicates(ranks):
    ws, res = ranks
    full, replicated = W.tp_data()
    total, clipped = _single_clip(full)
    for r, o in enumerate(_get(res, "tp")):
        assert same_bits(o["total"], total), f"rank {r}"
        for k, (g, rep) in enumerate(zip(clipped, replicated)):
            want = g if rep else torch.tensor_split(g, ws, dim=0)[r]
            assert same_bits(o["grads"][k], want), f"rank {r}, tensor {k}"


@pytest.mark.parametrize("name", ["fsdp2", "hsdp"])
def test_fsdp2(ranks, name):
    ws, res = ranks
    out = _get(res, name)
    if out[0] is None:
        pytest.skip("HSDP needs 4 ranks")
    full = out[0]["full"]
    total, clipped = _single_clip(full)
    for r, o in enumerate(out):
        assert all(same_bits(a, b) for a, b in zip(o["full"], full)), f"rank {r}"
        assert same_bits(o["total"], total), f"rank {r}"
        assert all(same_bits(a, b) for a, b in zip(o["clipped_full"], clipped)), f"rank {r}"
    placements = {p for o in out for ps in o["placements"] for p in ps}
    assert any(p.startswith("S(") for p in placements)  # str(Shard(0)) == "S(0)"
    if name == "hsdp":
        assert "R" in placements  # str(Replicate()) == "R"
    for r, o in enumerate(out):  # torch's return type: a Replicate DTensor on the mesh
        res = o["result"]
        assert res["type"] == "DTensor", f"rank {r}: {res['type']}"
        assert res["placements"] == ("R",) * (2 if name == "hsdp" else 1), res["placements"]
        assert sorted(_flat(res["mesh"])) == list(range(ws))
        assert same_bits(res["local"], total) and same_bits(res["full"], total), f"rank {r}"


def _flat(x):
    return [y for row in x for y in _flat(row)] if isinstance(x, list) else [x]


def test_fsdp2_returns_torchs_dtensor(ranks):
    """get_total_norm / clip_grad_norm_ on FSDP2 gradients: a Replicate
    DTensor on the gradients' mesh (torch's type: torch's p = 2 norm is one
    too), holding the exact single-process norm; .full_tensor() works;
    clip_grads_with_norm_ takes the DTensor; the clipped shards are the
    single-process clipped gradients."""
    ws, res = ranks
    out = _get(res, "fsdp2_result")
    full = out[0]["full"]
    total, clipped = _single_clip(full)
    inf_norm = bt.get_total_norm(full, float("inf"))
    assert float(inf_norm) == exact_norm(full, "float32", float("inf"))
    for r, o in enumerate(out):
        assert all(same_bits(a, b) for a, b in zip(o["full"], full)), f"rank {r}"
        assert o["torch_norm"]["type"] == "DTensor" and o["torch_norm"]["placements"] == ("R",)
        for key, want in (("norm", total), ("clip", total), ("norm_inf", inf_norm)):
            d = o[key]
            assert d["type"] == "DTensor", (r, key, d["type"])
            assert d["placements"] == ("R",) and d["mesh"] == list(range(ws)), (r, key, d)
            assert same_bits(d["local"], want) and same_bits(d["full"], want), (r, key)
        assert o["norm"]["same_mesh"] is True
        assert all(same_bits(a, b) for a, b in zip(o["clipped"], clipped)), f"rank {r}"
        assert all(same_bits(a, b) for a, b in zip(o["two_step"], clipped)), f"rank {r}"
        # each rank's shard is its piece of the clipped gradient (dim 0)
        for k, (loc, c) in enumerate(zip(o["clipped_local"], clipped)):
            want = torch.tensor_split(c, ws, dim=0)[r] if c.shape[0] % ws == 0 else None
            if want is not None:
                assert same_bits(loc, want), f"rank {r}, tensor {k}"


def test_midpoint_resolved_across_ranks(ranks):
    ws, res = ranks
    want = bt.get_total_norm([torch.tensor(W.MIDPOINT, dtype=torch.float32)])
    assert float(want) == 1 + 2.0 ** -23
    for r, o in enumerate(_get(res, "midpoint")):
        assert same_bits(o["total"], want), f"rank {r}"


def test_nonfinite_on_one_rank(ranks):
    """Every rank raises with the offender's location as integers (rank,
    group, tensor); the offending rank names its parameter, the others keep
    the position (it is another rank's tensor)."""
    ws, res = ranks
    for r, o in enumerate(_get(res, "nonfinite")):
        assert o["error"] is not None, f"rank {r} did not raise"
        assert f"rank {ws - 1}" in o["error"] and "NaN" in o["error"]
        assert o["where"] == (ws - 1, 0, 1), f"rank {r}: {o['where']}"
        if r == ws - 1:
            assert "parameters[1] holds NaN" in o["error"], o["error"]
        else:
            assert "group 0, tensor 1 holds NaN" in o["error"], o["error"]
            assert "parameters[" not in o["error"]
        assert o["unchanged"], f"rank {r} modified its gradients"


def test_local_failure_on_another_rank(ranks):
    """A rank's own failure keeps its own location and names its parameter;
    the other ranks report that rank and its location."""
    ws, res = ranks
    for r, o in enumerate(_get(res, "local_failure")):
        assert o["error"] is not None, f"rank {r} did not raise"
        assert o["type"] == "DTypeError", f"rank {r}: {o['type']}: {o['error']}"
        assert o["where"] == (ws - 1, 0, 2), f"rank {r}: {o['where']}"
        if r == ws - 1:
            assert "parameters[2]" in o["error"] and "int32" in o["error"], o["error"]
        else:
            assert f"rank {ws - 1} failed its local checks at group 0, tensor 2" in o["error"]
            assert "parameters[" not in o["error"], o["error"]


def test_norm_dtype_differs_between_ranks(ranks):
    """fp32 on rank 0, bf16 elsewhere: fp32 (torch's promotion of the whole
    set) on every rank; different norm_dtype= per rank: MismatchError on
    every rank, naming both dtypes."""
    ws, res = ranks
    from exact_ref import exact_norm
    want = torch.tensor(exact_norm([torch.ones(3 * ws)], "float32"), dtype=torch.float32)
    for r, o in enumerate(_get(res, "dtype_mismatch")):
        assert o["total"].dtype == torch.float32, f"rank {r}: {o['total']}"
        assert same_bits(o["total"], want), f"rank {r}: {o['total']}"
        assert o["error"] is not None and "norm_dtype" in o["error"], f"rank {r}: {o}"
        assert "float32" in o["error"] and "bfloat16" in o["error"], o["error"]


def test_mismatch_on_every_rank(ranks):
    ws, res = ranks
    for r, o in enumerate(_get(res, "mismatch")):
        assert o["error"] is not None and "norm_type" in o["error"], f"rank {r}"
