"""The Paddle native-ops counterpart of glm_native.py: transformers'
Glm4MoeForCausalLM formula (modeling_glm4_moe.py: eager attention, the
sigmoid group-limited top-k router, per-expert index_add, the shared
expert) written with Paddle's own eager ops, loaded from a `bitexact
train` checkpoint, trained with Paddle's gradient accumulation over
micro-batches, ``paddle.nn.ClipGradByGlobalNorm`` and
``paddle.optimizer.AdamW`` — what a Paddle user runs without bitexact.
tests/python/test_train_bindings.py uses it as the negative control: its
bits differ from the torch-native run's and move with the micro-batching,
while its loss agrees with `bitexact train`'s to fp32 accuracy.
"""
import json
import os

import numpy as np
import paddle
import paddle.nn.functional as F


class NativeRun:
    """`bitexact train`'s loop with Paddle's native numerics."""

    def __init__(self, ckpt, micro_batches=1, lr=1e-3, weight_decay=0.01, clip=1.0):
        from safetensors.numpy import load_file
        from bitexact.train import _data as _glm_data
        with open(os.path.join(ckpt, "config.json")) as f:
            self.c = c = json.load(f)
        with open(os.path.join(ckpt, "trainer_state.json")) as f:
            st = json.load(f)
        d = st["data"]
        self.L, self.B, self.M = d["seq_len"], d["global_batch"], micro_batches
        self.data = _glm_data.Data(c["vocab_size"], self.L, int(st["seed"]), None, d["shuffle"])
        arrays = load_file(os.path.join(ckpt, "model.safetensors"))
        self.p = {}
        for n, a in arrays.items():
            t = paddle.to_tensor(a)
            if not n.endswith("e_score_correction_bias"):
                t = paddle.create_parameter(a.shape, "float32",
                                            default_initializer=paddle.nn.initializer.Assign(a))
            self.p[n] = t
        self.params = [t for n, t in self.p.items() if not n.endswith("e_score_correction_bias")]
        self.opt = paddle.optimizer.AdamW(learning_rate=lr, parameters=self.params, beta1=0.9,
                                          beta2=0.999, epsilon=1e-8, weight_decay=weight_decay,
                                          grad_clip=paddle.nn.ClipGradByGlobalNorm(clip))
        D = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
        rd = int(D * c["partial_rotary_factor"])
        inv = 1.0 / (c["rope_theta"] ** (np.arange(0, rd, 2, dtype=np.float32) / rd))
        fr = np.arange(self.L, dtype=np.float32)[:, None] * inv[None, :]
        emb = np.concatenate([fr, fr], -1)
        self.cos, self.sin = paddle.to_tensor(np.cos(emb)), paddle.to_tensor(np.sin(emb))
        self.D, self.rd = D, rd
        self.mask = paddle.to_tensor(np.triu(np.full((self.L, self.L), -np.inf, np.float32), 1))

    def _lin(self, x, name, bias=False):
        y = paddle.matmul(x, self.p[name + ".weight"], transpose_y=True)
        return y + self.p[name + ".bias"] if bias else y

    def _norm(self, x, name):
        v = (x * x).mean(-1, keepdim=True)
        return self.p[name] * (x * paddle.rsqrt(v + self.c["rms_norm_eps"]))

    def _rope(self, x):
        xr, xp = x[..., :self.rd], x[..., self.rd:]
        h = self.rd // 2
        rot = paddle.concat([-xr[..., h:], xr[..., :h]], -1)
        return paddle.concat([xr * self.cos + rot * self.sin, xp], -1)

    def _attn(self, x, pre, B):
        c, D, L = self.c, self.D, self.L
        Hq, Hkv = c["num_attention_heads"], c["num_key_value_heads"]
        b = c["attention_bias"]
        q = self._lin(x, pre + "q_proj", b).reshape([B, L, Hq, D]).transpose([0, 2, 1, 3])
        k = self._lin(x, pre + "k_proj", b).reshape([B, L, Hkv, D]).transpose([0, 2, 1, 3])
        v = self._lin(x, pre + "v_proj", b).reshape([B, L, Hkv, D]).transpose([0, 2, 1, 3])
        if c.get("use_qk_norm"):
            q, k = self._norm(q, pre + "q_norm.weight"), self._norm(k, pre + "k_norm.weight")
        q, k = self._rope(q), self._rope(k)
        k = paddle.repeat_interleave(k, Hq // Hkv, axis=1)
        v = paddle.repeat_interleave(v, Hq // Hkv, axis=1)
        w = F.softmax(paddle.matmul(q, k, transpose_y=True) * D ** -0.5 + self.mask, axis=-1)
        o = paddle.matmul(w, v).transpose([0, 2, 1, 3]).reshape([B, L, Hq * D])
        return self._lin(o, pre + "o_proj")

    def _mlp(self, x, pre):
        return self._lin(F.silu(self._lin(x, pre + "gate_proj")) * self._lin(x, pre + "up_proj"),
                         pre + "down_proj")

    def _moe(self, x, pre):
        c = self.c
        E, K, G = c["n_routed_experts"], c["num_experts_per_tok"], c["n_group"]
        h = x.reshape([-1, x.shape[-1]])
        scores = F.sigmoid(paddle.matmul(h, self.p[pre + "gate.weight"], transpose_y=True))
        choice = scores + self.p[pre + "gate.e_score_correction_bias"]
        gs = paddle.topk(choice.reshape([-1, G, E // G]), 2, axis=-1)[0].sum(-1)
        gi = paddle.topk(gs, c["topk_group"], axis=-1)[1]
        gm = F.one_hot(gi, G).sum(1)
        sm = gm.unsqueeze(-1).expand([-1, G, E // G]).reshape([-1, E])
        choice = paddle.where(sm > 0, choice, paddle.full_like(choice, -np.inf))
        idx = paddle.topk(choice, K, axis=-1)[1]
        w = paddle.take_along_axis(scores, idx, 1)
        if c["norm_topk_prob"]:
            w = w / (w.sum(-1, keepdim=True) + 1e-20)
        w = w * c["routed_scaling_factor"]
        out = paddle.zeros_like(h)
        ids = idx.numpy()
        for e in range(E):
            tok, slot = np.nonzero(ids == e)
            if tok.size == 0:
                continue
            t = paddle.to_tensor(tok.astype(np.int64))
            y = self._mlp(paddle.gather(h, t), f"{pre}experts.{e}.")
            ww = paddle.gather_nd(w, paddle.to_tensor(np.stack([tok, slot], 1).astype(np.int64)))
            out = paddle.index_add(out, t, 0, y * ww.unsqueeze(-1))
        return out.reshape(x.shape) + self._mlp(x, pre + "shared_experts.")

    def loss(self, t):
        c, L = self.c, self.L
        B = t.shape[0]
        ids = paddle.to_tensor(t[:, :L])
        x = F.embedding(ids, self.p["model.embed_tokens.weight"])
        for i in range(c["num_hidden_layers"]):
            pre = f"model.layers.{i}."
            h1 = x + self._attn(self._norm(x, pre + "input_layernorm.weight"), pre + "self_attn.", B)
            xn = self._norm(h1, pre + "post_attention_layernorm.weight")
            x = h1 + (self._mlp(xn, pre + "mlp.") if i < c["first_k_dense_replace"]
                      else self._moe(xn, pre + "mlp."))
        logits = self._lin(self._norm(x, "model.norm.weight"), "lm_head")
        return F.cross_entropy(logits.reshape([-1, c["vocab_size"]]),
                               paddle.to_tensor(t[:, 1:].reshape([-1, 1])), reduction="sum")

    def step(self, s):
        """One step; returns the loss (float32)."""
        toks = np.stack([self.data.tokens(self.data.sequence(s * self.B + b))
                         for b in range(self.B)])
        per = self.B // self.M
        total = np.float32(0)
        for i in range(self.M):
            loss = self.loss(toks[i * per:(i + 1) * per]) / (self.B * self.L)
            loss.backward()
            total = np.float32(total + np.float32(loss.numpy()))
        self.opt.step()
        self.opt.clear_grad()
        return total
