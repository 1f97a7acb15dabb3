"""Port of PyTorch's
test/distributed/_composable/fsdp/test_fully_shard_clip_grad_norm_.py
(FSDP2) to the CPU with gloo against bitexact.torch.clip_grad_norm_:
test_clip_grad_norm_1d on 2 processes, test_clip_grad_norm_2d (dp x tp)
on 4 (fully_shard_worker.py). Kept from upstream, per iteration: the
reference's gradients equal the sharded model's full gradients, clipping
is not vacuous, the total norm equals the reference's (torch's
tolerance), every gradient's norm <= max_norm after clipping and every
non-zero gradient changed. Added: the norm's bits are the exact norm of
the full gradients, equal to the unsharded reference's bits. Differs on
purpose: the collectives (bitexact: two c10d all_reduce (int64 sum +
agreement max) where torch does one functional all_reduce per mesh dim).
Pending (issue 15 item 1): the norm returned as a Replicate DTensor, so
``total_norm.full_tensor()`` works."""
import os
import tempfile

import pytest
import torch
import torch.multiprocessing as mp

import fully_shard_worker as W
from helpers import same_bits
from port_models import free_port

pytestmark = pytest.mark.skipif(not torch.distributed.is_available()
                                or not torch.distributed.is_gloo_available(),
                                reason="torch.distributed with gloo is not available")


def _spawn(ws):
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(W.main, args=(ws, free_port(), d), nprocs=ws, join=True)
        return [torch.load(os.path.join(d, f"rank{r}.pt"), weights_only=False)
                for r in range(ws)]


@pytest.fixture(scope="module")
def ranks2():
    return _spawn(2)


@pytest.fixture(scope="module")
def ranks4():
    return _spawn(4)


def _iters(ranks, key):
    out = [r[key] for r in ranks]
    for r, o in enumerate(out):
        assert not isinstance(o, dict), f"rank {r}:\n{o['exception']}"
    return out


def _check(ranks, key, iters_expected):
    per_rank = _iters(ranks, key)
    for r, iters in enumerate(per_rank):
        assert len(iters) == iters_expected
        for k, it in enumerate(iters):
            at = f"rank {r}, iteration {k}"
            assert it["grads_close"], at
            assert it["ref_any_above"] and it["local_any_above"], f"{at}: clipping vacuous"
            # upstream: assertEqual(ref_total_norm, total_norm.full_tensor())
            torch.testing.assert_close(it["ref_total"], it["total"])
            # bitexact: the exact norm of the gradients, the same bits as the
            # unsharded reference's and a single process's
            if it["exact"] is not None:  # p = 1, 2, inf, first iteration
                assert float(it["total"]) == it["exact"], at
                assert float(it["ref_total"]) == it["ref_exact"], at
            # one process holding the whole (reversed) model: the same bits
            assert same_bits(it["total"], it["single"]), at
            assert same_bits(it["total"], it["ref_total"]), at
            assert same_bits(it["total"], per_rank[0][k]["total"]), at
            assert it["ref_after_ok"] and it["local_after_ok"], at
            assert it["ref_changed"] and it["local_changed"], at
            # differs on purpose: bitexact's two c10d all-reduces
            assert it["comm"] == {"c10d.allreduce_": 2}, (at, it["comm"])
    return per_rank


def _check_dtensor(ranks, key):
    for r, iters in enumerate(_iters(ranks, key)):
        for it in iters:
            assert it["is_dtensor"], f"rank {r}: the norm is a plain tensor"
            assert all(p.is_replicate() for p in it["total_placements"])
            assert same_bits(it["total_full"], it["total"])


@pytest.mark.parametrize("norm_type", W.NORMS_1D)
def test_clip_grad_norm_1d(ranks2, norm_type):
    _check(ranks2, ("1d", norm_type), W.ITERS)


@pytest.mark.parametrize("norm_type", W.NORMS_1D)
def test_clip_grad_norm_1d_returns_dtensor(ranks2, norm_type):
    _check_dtensor(ranks2, ("1d", norm_type))


@pytest.mark.parametrize("norm_type", W.NORMS_2D)
def test_clip_grad_norm_2d(ranks4, norm_type):
    per_rank = _check(ranks4, ("2d", norm_type), W.ITERS_2D)
    # the gradients are DTensors on the 2-D mesh (dp, tp)
    assert all(len(pl) == 2 for pl in per_rank[0][0]["placements"])


@pytest.mark.parametrize("norm_type", W.NORMS_2D)
def test_clip_grad_norm_2d_returns_dtensor(ranks4, norm_type):
    _check_dtensor(ranks4, ("2d", norm_type))
