"""bitexact.paddle's GLM-4.5 mixture-of-experts block (transformers'
``Glm4MoeMoE``) as ``paddle.autograd.PyLayer`` ops and ``paddle.nn.Layer``
modules, with the names, semantics and bits of bitexact.torch's
(docs/paddle_layers.md, "The MoE block"; docs/torch_layers.md).

The numerics are nn/_moe.py's, shared with bitexact.torch: the same
kernel calls in the same order on the same shapes (Paddle only allocates
with ``paddle.empty``, copies to contiguous and reshapes: the adapter of
paddle/_layers.py), so a Paddle MoE and a torch MoE holding the same
weights give the same output, input gradient and weight gradients bit for
bit (tests/python/test_paddle_moe.py). Weight gradients go to the active
:class:`~bitexact.paddle.GradReduction`; the PyLayers return None for
the weights.

What differs from the torch binding, and why: Paddle has no
``needs_input_grad``, so whether x (and moe_experts' topk_weights) wants a
gradient is its ``stop_gradient`` state at the call, passed to the PyLayer
as its last argument; an error raised in backward reaches the caller as
Paddle's ``OSError`` (Paddle wraps it; the message is bitexact's); the
router weight is initialised U(+-1/sqrt(H)) (torch's distribution, drawn
by Paddle's generator), and the bias is a persistable buffer
(``register_buffer``); the experts sit in a ``paddle.nn.LayerList`` (the
same ``experts.E....`` names). Not here: as nn/_moe.py (capacity,
GPU tensors), and Paddle's static graph.

Threading: as bitexact.torch's (calling thread; ``num_threads`` workers).
"""
import paddle

from ..nn import _moe as _ops
from ._gradred import _F32, _INTS, _capture, _check, _wants_grad
from ._layers import _FW, SwiGLUMLP, _uniform  # noqa: F401 (SwiGLUMLP: MoEBase)

__all__ = ["MoE", "MoERouter", "moe", "moe_route", "moe_experts"]

_PREFIX = "bitexact.paddle"
ModuleList = paddle.nn.LayerList  # the experts' container (nn._moe.MoEBase)
ModuleDict = paddle.nn.LayerDict  # under expert parallelism: the held experts by number
# need_dx: the states passed last to apply (kept on ctx.need_dx by _FW.dx_args)
_fn = _ops.autograd_functions(paddle.autograd.PyLayer, _FW, __name__,
                              lambda ctx, i: ctx.need_dx[i])
_B = _ops.Binding(fw=_FW, prefix=_PREFIX, check=_check, ints=_INTS, capture=_capture, fns=_fn,
                  need=lambda tensors: (tuple(_wants_grad(t) for t in tensors),))


@paddle.jit.not_to_static
def moe_route(x, router_weight, e_score_correction_bias, num_experts_per_tok, n_group=1,
              topk_group=1, norm_topk_prob=True, routed_scaling_factor=1.0, chunk_tokens=None,
              num_threads=None):
    """The routing of :func:`moe` without autograd: (topk_ids [T, k]
    int64, ascending expert id; topk_weights [T, k]; counts
    [ceil(T/chunk), E] int64 per-chunk expert loads), the ids and weights
    :func:`moe` uses. chunk_tokens: default the active GradReduction's
    seq_len, else T."""
    return _ops.moe_route(_B, x, router_weight, e_score_correction_bias, num_experts_per_tok,
                          n_group, topk_group, norm_topk_prob, routed_scaling_factor,
                          chunk_tokens, num_threads)


@paddle.jit.not_to_static
def moe(x, router_weight, e_score_correction_bias, gate_weights, up_weights, down_weights,
        shared_gate_weight, shared_up_weight, shared_down_weight, num_experts_per_tok,
        n_group=1, topk_group=1, norm_topk_prob=True, routed_scaling_factor=1.0,
        num_threads=None, expert_parallel=None):
    """Glm4MoeMoE.forward(x), as bitexact.torch.moe: x [T, H] or [B, L, H];
    router_weight [E, H]; the bias [E] (no gradient); gate/up_weights E
    tensors [I, H], down_weights E tensors [H, I] (with expert_parallel:
    all E, or the ep.nl this rank holds from ep.first); shared_* the
    shared experts' MLP. Returns routed + shared; weight gradients into the
    active GradReduction; x's gradient by Paddle (stop_gradient=False)."""
    return _ops.moe(_B, x, router_weight, e_score_correction_bias, gate_weights, up_weights,
                    down_weights, shared_gate_weight, shared_up_weight, shared_down_weight,
                    num_experts_per_tok, n_group, topk_group, norm_topk_prob,
                    routed_scaling_factor, num_threads,
                    _ops.LOCAL_ROWS if expert_parallel is None else expert_parallel)


@paddle.jit.not_to_static
def moe_experts(x, topk_ids, topk_weights, gate_weights, up_weights, down_weights,
                num_threads=None):
    """Glm4MoeExperts.forward(x, top_k_index, top_k_weights) with 2-D
    experts, as bitexact.torch.moe_experts. Gradients to x and
    topk_weights by Paddle (where stop_gradient=False), to the expert
    weights by the GradReduction."""
    return _ops.moe_experts(_B, x, topk_ids, topk_weights, gate_weights, up_weights,
                            down_weights, num_threads)


class MoERouter(paddle.nn.Layer):
    """Glm4MoeTopkRouter's state: weight [E, H] (a parameter trained
    through the block; U(+-1/sqrt(H)), torch's Linear distribution) and
    the e_score_correction_bias buffer [E] (zeros, persistable: in
    state_dict; not trained)."""

    def __init__(self, hidden_size, n_routed_experts):
        super().__init__()
        self.weight = self.create_parameter([n_routed_experts, hidden_size], dtype="float32",
                                            default_initializer=_uniform(hidden_size ** -0.5))
        self.register_buffer("e_score_correction_bias",
                             paddle.zeros([n_routed_experts], dtype=_F32), persistable=True)


class MoE(_ops.MoEBase, paddle.nn.Layer):
    """bitexact.torch.MoE for Paddle: the same constructor
    (``MoE(hidden_size, moe_intermediate_size, n_routed_experts,
    num_experts_per_tok, n_shared_experts=1, n_group=1, topk_group=1,
    norm_topk_prob=True, routed_scaling_factor=1.0)``, ``from_config``),
    the same parameter and buffer names (gate.weight,
    gate.e_score_correction_bias, experts.E.{gate,up,down}_proj.weight,
    shared_experts.{gate,up,down}_proj.weight), the same bits.
    forward(x [T, H] or [B, L, H]) -> same shape; route(x) as
    :func:`moe_route`."""
