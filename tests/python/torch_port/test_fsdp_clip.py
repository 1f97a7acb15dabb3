"""Port of PyTorch's test/distributed/fsdp/test_fsdp_clip_grad_norm.py
(FSDP1) to the CPU with gloo, 2 processes, against bitexact.torch's
clip_grad_norm_ (fsdp_worker.py runs every scenario once; each test
below checks one upstream subtest). Kept from upstream: DDP vs FSDP norm
parity within torch's tolerance, gradients modified by clipping,
parameters equal after an Adam step, fp16 norm for fp16 gradients,
per-gradient norms <= max_norm, fp32 zero without gradients, fp32 for
mixed gradient dtypes. Added (bitexact's guarantee): the FSDP norm's bits
are the exact norm of all ranks' gradients, the same on every rank, and
DDP's (unsharded) norm is the exact norm of its gradients. Not portable:
CPU offload (FSDP pins host memory, which needs CUDA), the non-root check
(FSDP's method, not the drop-in). See docs/torch_port.md."""
import os
import tempfile

import pytest
import torch
import torch.multiprocessing as mp

import fsdp_worker as W
from helpers import same_bits
from port_models import free_port

pytestmark = pytest.mark.skipif(not torch.distributed.is_available()
                                or not torch.distributed.is_gloo_available(),
                                reason="torch.distributed with gloo is not available")
WS = 2


@pytest.fixture(scope="module")
def ranks():
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(W.main, args=(WS, free_port(), d), nprocs=WS, join=True)
        return [torch.load(os.path.join(d, f"rank{r}.pt"), weights_only=False)
                for r in range(WS)]


def _get(ranks, key):
    out = [r[key] for r in ranks]
    for r, o in enumerate(out):
        assert "exception" not in o, f"rank {r}:\n{o['exception']}"
    return out


@pytest.mark.parametrize("case", W.PARITY, ids=W.parity_id)
def test_ddp_parity(ranks, case):
    """upstream test_ddp_parity (offload_params=False; True: not portable)."""
    outs = _get(ranks, ("parity", W.parity_id(case)))
    for r, o in enumerate(outs):
        # upstream: assertEqual(ddp_total_norm, fsdp_total_norm)
        torch.testing.assert_close(o["ddp"], o["fsdp"])
        # bitexact: both are the exact norms of their gradients, bit for bit
        assert float(o["ddp"]) == o["ddp_exact"], f"rank {r}"
        assert float(o["fsdp"]) == o["fsdp_exact"], f"rank {r}"
        assert same_bits(o["fsdp"], outs[0]["fsdp"]), f"rank {r} differs from rank 0"
        assert o["ddp_modified"] and o["fsdp_modified"], f"rank {r}: clipping was vacuous"
        for (n1, n2), (p1, p2) in zip(o["names"], o["params"]):
            assert n1 == n2
            torch.testing.assert_close(p1, p2, msg=lambda m: f"rank {r}, {n1}: {m}")
        for k, (d, f) in enumerate(o["later"]):
            torch.testing.assert_close(d, f, msg=lambda m: f"rank {r}, iteration {k}: {m}")
            assert same_bits(f, outs[0]["later"][k][1])


@pytest.mark.parametrize("case", W.LOW_PRECISION, ids=W.parity_id)
def test_low_precision_grads(ranks, case):
    max_norm, norm_type, _, _ = case
    outs = _get(ranks, ("low_precision", W.parity_id(case)))
    for r, o in enumerate(outs):
        assert o["grad_dtypes"] == {torch.float16}, f"rank {r}"
        # the total norm is fp16, the gradients' dtype
        assert o["total"].dtype == torch.float16
        assert float(o["total"]) == o["exact"], f"rank {r}: not the exact fp16 norm"
        assert same_bits(o["total"], outs[0]["total"])
        assert all(n <= max_norm for n in o["after"]), (f"rank {r}", o["after"])


@pytest.mark.parametrize("orig", [False, True], ids=["flat", "orig_params"])
def test_no_gradients(ranks, orig):
    """Without gradients: a 0-dim fp32 zero. FSDP's method also warns
    ("... with no gradients -- returning the total norm in the default
    dtype"); that warning is the FSDP method's, not torch.nn.utils'
    (nor the drop-in's): bitexact does not warn."""
    for r, o in enumerate(_get(ranks, ("no_gradients", orig))):
        assert o["total"].dtype == torch.float32 and o["total"].dim() == 0
        assert float(o["total"]) == 0.0
        assert not any("no gradients" in m for m in o["warnings"]), o["warnings"]


def test_non_uniform_grad_dtype(ranks):
    outs = _get(ranks, ("non_uniform", None))
    for r, o in enumerate(outs):
        assert len(o["grad_dtypes"]) > 1, "expected mixed gradient dtypes"
        assert o["total"].dtype == torch.float32
        assert float(o["total"]) == o["exact"]
        assert same_bits(o["total"], outs[0]["total"])
