"""bitexact.torch's GLM-4.5 mixture-of-experts block (transformers'
``Glm4MoeMoE``) as torch autograd Functions and an nn.Module
(docs/torch_layers.md, "The MoE block").

The numerics (the kernel sequence and orders of `bitexact train`'s
src/glm/train_moe_block.c: router, dispatch, the experts on their rows,
the shared experts, the combine, the one-node backward, the expert weight
gradients per global chunk) are nn/_moe.py's, shared with
bitexact.paddle; this file holds torch's binding of them (the Functions,
made by nn._moe.autograd_functions, the public functions and the
modules). torch only allocates, copies to contiguous and reshapes (the
adapter of torch/_layers.py).

Differences from transformers (docs/train_moe.md): ties break toward the
lower group / expert id (torch.topk(sorted=False) leaves them open); the
sigmoid is correctly rounded; the top-k denominator is summed in fp64; the
experts are 2-D per expert (the hub checkpoints' experts.E.{gate,up,down}_
proj.weight, as `bitexact train`), not transformers 5's 3-D gate_up_proj.
The e_score_correction_bias is a buffer that is not trained (as in
transformers and `bitexact train`); :func:`moe_route` returns the
per-chunk expert counts for a caller's ``bitexact.kernels.moe_bias_update``.

Every check runs and the whole forward is computed before the module
registers its weights with the GradReduction: a failing call changes
nothing (no partial, no registration). Threading as torch/_layers.py.
Expert parallelism (``moe(..., expert_parallel=)``, nn/_ep.py) and bf16
compute are nn/_moe.py's. Not here: capacity / token dropping, CUDA
tensors.
"""
import torch

from ..nn import _moe as _ops
from . import _compile as _tc
from ._gradred import _F32, _capture, _check
from ._layers import _FW, Linear, SwiGLUMLP  # noqa: F401 (SwiGLUMLP: MoEBase)

__all__ = ["MoE", "MoERouter", "moe", "moe_route", "moe_experts"]

_PREFIX = "bitexact.torch"
ModuleList = torch.nn.ModuleList  # the experts' container (nn._moe.MoEBase)
ModuleDict = torch.nn.ModuleDict  # under expert parallelism: the held experts by number
_fn = _ops.autograd_functions(_tc.Function, _FW, __name__,
                              lambda ctx, i: ctx.needs_input_grad[i])
_B = _ops.Binding(fw=_FW, prefix=_PREFIX, check=_check, ints=(torch.int32, torch.int64),
                  capture=_capture, fns=_fn, need=lambda tensors: ())


@torch.compiler.disable(reason="bitexact.torch.moe_route is not traced by torch.compile (its "
                        "chunk count depends on the active GradReduction at run time): call it "
                        "outside the compiled function")
def moe_route(x, router_weight, e_score_correction_bias, num_experts_per_tok, n_group=1,
              topk_group=1, norm_topk_prob=True, routed_scaling_factor=1.0, chunk_tokens=None,
              num_threads=None):
    """The routing of :func:`moe` without autograd: (topk_ids [T, k] int64,
    ascending expert id; topk_weights [T, k]; counts [ceil(T/chunk), E]
    int64, the per-chunk expert loads, integers) computed by the same
    kernels, so the ids and weights are the ones :func:`moe` uses.
    chunk_tokens: default the active GradReduction's seq_len, else T. Not
    traced by torch.compile (a graph break)."""
    return _ops.moe_route(_B, x, router_weight, e_score_correction_bias, num_experts_per_tok,
                          n_group, topk_group, norm_topk_prob, routed_scaling_factor,
                          chunk_tokens, num_threads)


def moe(x, router_weight, e_score_correction_bias, gate_weights, up_weights, down_weights,
        shared_gate_weight, shared_up_weight, shared_down_weight, num_experts_per_tok,
        n_group=1, topk_group=1, norm_topk_prob=True, routed_scaling_factor=1.0,
        num_threads=None, expert_parallel=None):
    """Glm4MoeMoE.forward(x): x [T, H] or [B, L, H] (the post-attention
    norm's output); router_weight [E, H]; the bias [E] (no gradient);
    gate/up_weights E tensors [I, H], down_weights E tensors [H, I] (with
    expert_parallel: all E, or the ep.nl this rank holds from ep.first);
    shared_* the shared experts' MLP ([SI, H], [SI, H], [H, SI]).
    Returns routed + shared [.., H]; weight gradients into the active
    GradReduction (every trainable weight, one micro-batch's tokens)."""
    if _tc.compiling():
        return _tc.call("moe", (x, router_weight, e_score_correction_bias, gate_weights,
                                up_weights, down_weights, shared_gate_weight, shared_up_weight,
                                shared_down_weight, num_experts_per_tok, n_group, topk_group,
                                norm_topk_prob, float(routed_scaling_factor), num_threads,
                                expert_parallel))
    return _ops.moe(_B, x, router_weight, e_score_correction_bias, gate_weights, up_weights,
                    down_weights, shared_gate_weight, shared_up_weight, shared_down_weight,
                    num_experts_per_tok, n_group, topk_group, norm_topk_prob,
                    routed_scaling_factor, num_threads,
                    _ops.LOCAL_ROWS if expert_parallel is None else expert_parallel)


def moe_experts(x, topk_ids, topk_weights, gate_weights, up_weights, down_weights,
                num_threads=None):
    """Glm4MoeExperts.forward(x, top_k_index, top_k_weights) with 2-D
    experts: out[t] = sum over the slots j of token t, in ascending slot
    order, of fl(w[t][j] * expert_{ids[t][j]}(x[t])) (bx_moe_unpermute; the
    ids as :func:`moe_route` gives them, ascending, reproduce transformers'
    per-expert index_add_ order). Gradients to x and topk_weights (torch)
    and to the expert weights (the GradReduction)."""
    if _tc.compiling():
        return _tc.call("moe_experts", (x, topk_ids, topk_weights, gate_weights, up_weights,
                                        down_weights, num_threads))
    return _ops.moe_experts(_B, x, topk_ids, topk_weights, gate_weights, up_weights,
                            down_weights, num_threads)


class MoERouter(torch.nn.Module):
    """Glm4MoeTopkRouter's state: weight [E, H] (a Parameter, trained
    through the block; torch's Linear init) and the e_score_correction_bias
    buffer [E] (zeros; not trained). Routing runs inside :class:`MoE`
    (one autograd node)."""

    def __init__(self, hidden_size, n_routed_experts):
        super().__init__()
        ref = Linear(hidden_size, n_routed_experts)
        self.weight = ref.weight
        self.register_buffer("e_score_correction_bias", torch.zeros(n_routed_experts, dtype=_F32))


class MoE(_ops.MoEBase, torch.nn.Module):
    """transformers' Glm4MoeMoE(config) through the bitexact kernels, with
    `bitexact train`'s parameter names: gate.weight,
    gate.e_score_correction_bias (buffer), experts.E.{gate,up,down}_proj.
    weight (2-D, E ascending), shared_experts.{gate,up,down}_proj.weight
    (intermediate moe_intermediate_size * n_shared_experts). Init: torch's
    Linear init for every weight (load a checkpoint for transformers' or
    `bitexact train`'s). ``MoE(hidden_size, moe_intermediate_size,
    n_routed_experts, num_experts_per_tok, n_shared_experts=1, n_group=1,
    topk_group=1, norm_topk_prob=True, routed_scaling_factor=1.0)`` or
    ``MoE.from_config(cfg)``; forward(x [T, H] or [B, L, H]) -> same
    shape; ``route(x)`` as :func:`moe_route`."""


_tc.register_layers()  # the layer functions of the compiled ops (_torch_compile._LAYERS)
