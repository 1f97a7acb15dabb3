"""The GLM-4.5 mixture-of-experts decoder (transformers' ``Glm4MoeConfig`` /
``Glm4MoeForCausalLM``) built from bitexact's layers, framework-neutral:
the bodies here call the layers module of their framework (``_bx_api``:
bitexact.torch._glm or bitexact.paddle._glm), whose subclasses add
``torch.nn.Module`` / ``paddle.nn.Layer``. The forward is the one of
`bitexact train` (docs/train_model.md, src/glm/train_step.c,
train_layers.c, train_moe_block.c), kernel for kernel, so a step of the
torch model, of the Paddle model and of the C trainer give the same bits:

    x = embed_tokens[ids]
    per layer: xn1 = input_layernorm(x); q, k, v = qkv_projection(xn1) (+ bias)
               [q_norm, k_norm per head]; RoPE; causal GQA attention;
               h1 = x + o_proj(o); xn2 = post_attention_layernorm(h1);
               x = h1 + (dense MLP | MoE block)(xn2)
    logits = lm_head(norm(x)); loss = cross_entropy(logits, labels)

Every residual addition is one fp32 addition of two terms; autograd adds
the two gradient branches of a residual stream with one addition too
(commutative: the engine's order cannot change a bit), which is the
``fl(dh + dbranch)`` of the C backward. Where one tensor feeds three or
more consumers (q/k/v, the MoE block's router / experts / shared expert),
the consumers are one autograd node with the C trainer's accumulation
order.

Parameter names and order: transformers' ``named_parameters()`` with the
routed experts 2-D under the hub checkpoints' names
(``model.layers.N.mlp.experts.E.{gate,up,down}_proj.weight``), the
``e_score_correction_bias`` buffers not trained: the names of a `bitexact
train` checkpoint's model.safetensors.

Threading: a model is used by one thread at a time (its GradReduction's).
"""
import json
import types

import numpy as _np

from .. import InvalidArgumentError
from ..nn._gradred import _active
from ..nn._layers import _ModuleBase

# Glm4MoeConfig's fields the model reads, with transformers' defaults (the
# full-size model; `bitexact train` writes every field).
_DEFAULTS = dict(vocab_size=151552, hidden_size=4096, intermediate_size=10944,
                 num_hidden_layers=46, num_attention_heads=96, num_key_value_heads=8,
                 head_dim=None, partial_rotary_factor=0.5, rope_theta=1000000.0,
                 rms_norm_eps=1e-5, attention_bias=False, use_qk_norm=False,
                 moe_intermediate_size=1408, num_experts_per_tok=8, n_shared_experts=1,
                 n_routed_experts=128, routed_scaling_factor=1.0, n_group=1, topk_group=1,
                 first_k_dense_replace=1, norm_topk_prob=True, max_position_embeddings=131072,
                 tie_word_embeddings=False, hidden_act="silu", attention_dropout=0.0)


def config(source):
    """A config namespace from a path to config.json, a dict, or an object
    with Glm4MoeConfig's attributes (transformers' config). Refused
    (InvalidArgumentError naming the field): model_type other than
    glm4_moe, tied embeddings, another activation, dropout, rope scaling."""
    if isinstance(source, str):
        with open(source, encoding="utf-8") as f:
            source = json.load(f)
    d = dict(source) if isinstance(source, dict) else {k: getattr(source, k) for k in _DEFAULTS
                                                       if hasattr(source, k)}
    if isinstance(source, dict) and d.get("model_type", "glm4_moe") != "glm4_moe":
        raise InvalidArgumentError(f"config: model_type '{d['model_type']}': glm4_moe expected")
    rp = d.get("rope_parameters") or {}
    for k in ("rope_theta", "partial_rotary_factor"):
        if k not in d and k in rp:
            d[k] = rp[k]
    c = dict(_DEFAULTS)
    c.update({k: v for k, v in d.items() if k in _DEFAULTS})
    if c["head_dim"] is None:
        c["head_dim"] = c["hidden_size"] // c["num_attention_heads"]
    for k, want in (("tie_word_embeddings", False), ("hidden_act", "silu"),
                    ("attention_dropout", 0.0)):
        if c[k] != want:
            raise InvalidArgumentError(f"config: {k} {c[k]!r} is not supported ({want!r} only)")
    if d.get("rope_scaling") not in (None, {}) and (d.get("rope_scaling") or {}).get(
            "rope_type", "default") != "default":
        raise InvalidArgumentError(f"config: rope_scaling {d['rope_scaling']!r} is not supported")
    if c["num_attention_heads"] % c["num_key_value_heads"]:
        raise InvalidArgumentError(f"config: num_attention_heads {c['num_attention_heads']} is "
                                   f"not a multiple of num_key_value_heads {c['num_key_value_heads']}")
    return types.SimpleNamespace(**c)


class AttentionBase(_ModuleBase):
    """Glm4MoeAttention: q/k/v (bias with attention_bias) as one
    qkv_projection node, q_norm / k_norm per head with use_qk_norm, RoPE
    on the first int(head_dim * partial_rotary_factor) features of each
    head, causal GQA eager attention per sequence, o_proj (no bias)."""

    def __init__(self, cfg):
        super().__init__()
        api = self._bx_api
        H, D = cfg.hidden_size, cfg.head_dim
        self.dims = (cfg.num_attention_heads, cfg.num_key_value_heads, D)
        b = bool(cfg.attention_bias)
        self.q_proj = api.Linear(H, cfg.num_attention_heads * D, bias=b)
        self.k_proj = api.Linear(H, cfg.num_key_value_heads * D, bias=b)
        self.v_proj = api.Linear(H, cfg.num_key_value_heads * D, bias=b)
        self.o_proj = api.Linear(cfg.num_attention_heads * D, H)
        self.use_qk_norm, self.eps = bool(cfg.use_qk_norm), cfg.rms_norm_eps
        if self.use_qk_norm:
            self.q_norm = api.RMSNorm(D, cfg.rms_norm_eps)
            self.k_norm = api.RMSNorm(D, cfg.rms_norm_eps)
        self.rotary_dim = int(D * cfg.partial_rotary_factor)
        self.theta = float(cfg.rope_theta)

    def forward(self, x, positions, seq_len):
        api = self._bx_api
        Hq, Hkv, D = self.dims
        T = x.shape[0]
        q, k, v = api.qkv_projection(x, self.q_proj.weight, self.k_proj.weight,
                                     self.v_proj.weight, q_bias=self.q_proj.bias,
                                     k_bias=self.k_proj.bias, v_bias=self.v_proj.bias)
        if self.use_qk_norm:
            q = api.rms_norm(q.reshape([T * Hq, D]), self.q_norm.weight, self.eps).reshape([T, Hq * D])
            k = api.rms_norm(k.reshape([T * Hkv, D]), self.k_norm.weight, self.eps).reshape([T, Hkv * D])
        q = api.rope(q, positions, D, self.rotary_dim, self.theta)
        k = api.rope(k, positions, D, self.rotary_dim, self.theta)
        return self.o_proj(api.causal_attention(q, k, v, seq_len, Hq, Hkv, D))


class DecoderLayerBase(_ModuleBase):
    """Glm4MoeDecoderLayer: self_attn, mlp (the dense SwiGLU MLP for
    layer < first_k_dense_replace, else the MoE block), input_layernorm,
    post_attention_layernorm."""

    def __init__(self, cfg, layer_idx, expert_parallel=None):
        super().__init__()
        api = self._bx_api
        self.self_attn = api.Glm4MoeAttention(cfg)
        self.mlp = (api.SwiGLUMLP(cfg.hidden_size, cfg.intermediate_size)
                    if layer_idx < cfg.first_k_dense_replace
                    else api.MoE.from_config(cfg, expert_parallel=expert_parallel))
        self.input_layernorm = api.RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = api.RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, positions, seq_len):
        h1 = x + self.self_attn(self.input_layernorm(x), positions, seq_len)
        return h1 + self.mlp(self.post_attention_layernorm(h1))


class ModelBase(_ModuleBase):
    """Glm4MoeModel: embed_tokens, layers, norm."""

    def __init__(self, cfg, expert_parallel=None):
        super().__init__()
        api = self._bx_api
        self.embed_tokens = api.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = api.ModuleList([api.Glm4MoeDecoderLayer(cfg, i, expert_parallel)
                                      for i in range(cfg.num_hidden_layers)])
        self.norm = api.RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, input_ids):
        """input_ids [B, L] (int32/int64; B whole sequences of L tokens,
        positions 0 .. L-1 each) -> the final norm's output [B*L, H]."""
        B, L = input_ids.shape
        positions = self._bx_api._positions(B, L)
        x = self.embed_tokens(input_ids.reshape([B * L]))
        for layer in self.layers:
            x = layer(x, positions, L)
        return self.norm(x)


class ForCausalLMBase(_ModuleBase):
    """Glm4MoeForCausalLM: ``model`` and ``lm_head``. forward(input_ids [B,
    L], labels [B, L] or None) -> the mean cross-entropy loss (a 0-d fp32
    tensor; inside a GradReduction micro-batch its chunk partials go to
    the step's loss) when labels are given, else the logits [B, L, V].
    Labels are the next tokens (no shift here, no ignore_index: `bitexact
    train` predicts every position).

    ``expert_parallel`` (a bitexact.nn.ExpertParallel): the MoE blocks
    hold only this rank's routed experts (weights, and so gradients and
    optimizer state) and exchange the rows with the other EP ranks; the
    parameters keep their global names (``...experts.E...``), a
    GradReduction given the same object reduces them over their replicas
    only, and :meth:`load_checkpoint` takes this rank's slice of a whole
    checkpoint."""

    def __init__(self, cfg, expert_parallel=None):
        super().__init__()
        cfg = config(cfg)
        if cfg.max_position_embeddings < 1:
            raise InvalidArgumentError("config: max_position_embeddings must be >= 1")
        self.config = cfg
        self._ep = expert_parallel
        api = self._bx_api
        self.model = api.Glm4MoeModel(cfg, expert_parallel)
        self.lm_head = api.Linear(cfg.hidden_size, cfg.vocab_size)

    def _foreign(self, name):
        """Whether name is a routed expert another EP rank holds (skipped
        by load_checkpoint)."""
        ep = self._ep
        if ep is None or not is_expert(name):
            return False
        try:
            e = int(name.split(".mlp.experts.")[1].split(".")[0])
        except ValueError:
            return False
        return 0 <= e < ep.NE and not ep.holds(e)

    def forward(self, input_ids, labels=None):
        if len(input_ids.shape) != 2:
            raise InvalidArgumentError(f"Glm4MoeForCausalLM: input_ids has shape "
                                       f"{list(input_ids.shape)}: [B, L] expected")
        B, L = input_ids.shape
        if labels is not None and list(labels.shape) != [B, L]:
            raise InvalidArgumentError(f"Glm4MoeForCausalLM: labels has shape "
                                       f"{list(labels.shape)}, input_ids {[B, L]}: equal expected")
        if L > self.config.max_position_embeddings:
            raise InvalidArgumentError(f"Glm4MoeForCausalLM: sequences of {L} tokens exceed "
                                       f"max_position_embeddings {self.config.max_position_embeddings}")
        if self._bx_api._compiling():  # torch.compile: no rollback (docs/torch_layers.md)
            return self._forward(input_ids, labels, B, L)
        red = _active()
        mb = red._mb if red is not None else None
        before = (set(mb.used), mb.loss_used) if mb is not None else None
        try:
            return self._forward(input_ids, labels, B, L)
        except BaseException:  # a refused call (an id, a label) registers nothing
            if mb is not None:
                mb.used.clear()
                mb.used.update(before[0])
                mb.loss_used = before[1]
            raise

    def _forward(self, input_ids, labels, B, L):
        logits = self.lm_head(self.model(input_ids))
        if labels is None:
            return logits.reshape([B, L, self.config.vocab_size])
        return self._bx_api.cross_entropy(logits, labels.reshape([B * L]))


def is_expert(name):
    """Whether a parameter name is a routed expert's (the clipping group
    "expert" of `bitexact train`; everything else is "dense")."""
    return ".mlp.experts." in name


def checked_arrays(own, tensors, shape_of, foreign=None):
    """{name: float32 array} for every name of own, checked against
    tensors (names, shapes, dtypes; nothing extra but the names for which
    foreign(name): another EP rank's experts, not read)."""
    missing = [n for n in own if n not in tensors]
    extra = [n for n in tensors if n not in own and not (foreign and foreign(n))]
    if missing or extra:
        raise InvalidArgumentError(f"load_checkpoint: missing {missing[:3]}{'...' if len(missing) > 3 else ''}"
                                   f", unexpected {extra[:3]}{'...' if len(extra) > 3 else ''}")
    out = {}
    for n, t in own.items():
        a = _np.asarray(tensors[n])
        if a.dtype != _np.float32 or tuple(a.shape) != shape_of(t):
            raise InvalidArgumentError(f"load_checkpoint: {n}: {a.dtype} {tuple(a.shape)}, float32 "
                                       f"{shape_of(t)} expected")
        out[n] = _np.ascontiguousarray(a)
    return out


def check_adamw(lr, betas, eps, weight_decay):
    """The AdamW hyperparameters of both bindings' AdamW, checked."""
    if not lr >= 0 or not eps >= 0 or not weight_decay >= 0 or \
            not all(0 <= b < 1 for b in betas):
        raise InvalidArgumentError(f"AdamW: lr {lr}, betas {betas}, eps {eps}, weight_decay "
                                   f"{weight_decay}: lr, eps, weight_decay >= 0, 0 <= beta < 1")


class RunnerBase:
    """The framework hooks of bitexact.train._run that are spelled alike in
    torch and Paddle (the subclasses add name, Model, AdamW,
    GradReduction, ids, numpy, init_distributed)."""

    compile = None  # torch: f compiled, f the model or the optimizer's step (--compile)

    @staticmethod
    def alltoall(rank, world, ep):
        """The framework's all-to-all over this rank's EP group (ep
        consecutive ranks) as a function a2a(send, sbytes, rbytes) ->
        received bytes (numpy uint8), for expert parallelism; None: the
        all-reduce exchange of nn._ep (Paddle: its gloo backend has no
        all-to-all, docs/train_python.md)."""
        return None

    @staticmethod
    def replica(rank, world, ep):
        """A bitexact.Comm over the ranks of this rank's EP rank (rank % ep:
        one per EP group), for the held experts' gradient words; None: an
        exact emulation over the whole comm (nn._ep.ExpertParallel.replica_comm)."""
        return None

    @staticmethod
    def grad(p):
        return p.grad

    @staticmethod
    def backward(loss):
        loss.backward()

    @staticmethod
    def named_parameters(m):
        return list(m.named_parameters())

    @staticmethod
    def named_buffers(m):
        return list(m.named_buffers())
