"""Expert parallelism in the framework models (docs/train_python.md,
"Expert parallelism"): a model built with an ExpertParallel holds only
its rank's routed experts (so its gradients and AdamW state are only
those), under their global names; load_checkpoint takes that slice of a
whole checkpoint; a GradReduction given the same object reduces them
over the replicas. The bits of a multi-rank step are the golden tests'
(test_train_golden.py: torch and Paddle --ep 2 against `bitexact train`)."""
import numpy as np
import pytest

import bitexact as bx
from bitexact.nn._ep import ExpertParallel

CFG = dict(vocab_size=64, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
           num_attention_heads=4, num_key_value_heads=2, head_dim=4, moe_intermediate_size=8,
           num_experts_per_tok=2, n_routed_experts=8, n_shared_experts=1, n_group=2,
           topk_group=1, first_k_dense_replace=1, routed_scaling_factor=1.0,
           max_position_embeddings=32)


def _fw(name):
    if name == "torch":
        pytest.importorskip("torch")
        from bitexact.torch import _glm as g
    else:
        pytest.importorskip("paddle")
        from bitexact.paddle import _glm as g
    return g


def _np(t):
    return np.array(t.detach().numpy() if hasattr(t, "detach") else t.numpy())


@pytest.mark.parametrize("fw", ["torch", "paddle"])
@pytest.mark.parametrize("rank", [0, 1, 3])
def test_rank_holds_only_its_experts(fw, rank):
    g = _fw(fw)
    full = g.Glm4MoeForCausalLM(CFG)
    ckpt = {n: _np(t) + 0 for n, t in list(full.named_parameters()) + list(full.named_buffers())}
    ep = ExpertParallel(None, rank, 4, 2, 8)  # 4 ranks, EP groups of 2: EP rank = rank % 2
    m = g.Glm4MoeForCausalLM(CFG, expert_parallel=ep)
    names = [n for n, _ in m.named_parameters()]
    held = sorted({int(n.split(".experts.")[1].split(".")[0]) for n in names if ".experts." in n})
    assert held == list(range(4 * (rank % 2), 4 * (rank % 2) + 4))
    full_names = [n for n, _ in full.named_parameters()]
    assert names == [n for n in full_names if ".experts." not in n or
                     int(n.split(".experts.")[1].split(".")[0]) in held]  # the global order
    n_exp = sum(int(np.prod(p.shape)) for n, p in m.named_parameters() if ".experts." in n)
    n_all = sum(int(np.prod(p.shape)) for n, p in full.named_parameters() if ".experts." in n)
    assert 2 * n_exp == n_all
    m.load_checkpoint(ckpt)  # the whole checkpoint: the other ranks' experts are skipped
    for n, p in m.named_parameters():
        assert np.array_equal(_np(p).view(np.uint32), ckpt[n].view(np.uint32)), n
    assert all(ep.is_local(p) == (".experts." in n) for n, p in m.named_parameters())
    missing = dict(ckpt)
    del missing[f"model.layers.1.mlp.experts.{held[0]}.up_proj.weight"]
    with pytest.raises(bx.InvalidArgumentError, match=f"experts.{held[0]}.up_proj"):
        m.load_checkpoint(missing)
    extra = dict(ckpt)
    extra["model.layers.1.mlp.experts.9.up_proj.weight"] = ckpt[names[-1]]
    with pytest.raises(bx.InvalidArgumentError, match="unexpected"):
        m.load_checkpoint(extra)


def test_moe_takes_all_or_the_held_experts_only():
    pytest.importorskip("torch")
    import torch
    from bitexact import torch as bt
    m = bt.MoE(16, 8, 8, 2)
    ep = ExpertParallel(None, 1, 2, 2, 8)
    w = [e.gate_proj.weight for e in m.experts]
    with pytest.raises(bx.InvalidArgumentError, match="all 8, or the 4 this rank holds"):
        bt.moe(torch.randn(4, 16), m.gate.weight, m.gate.e_score_correction_bias, w[:3], w[:3],
               w[:3], m.shared_experts.gate_proj.weight, m.shared_experts.up_proj.weight,
               m.shared_experts.down_proj.weight, 2, expert_parallel=ep)
