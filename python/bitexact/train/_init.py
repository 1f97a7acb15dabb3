"""``python -m bitexact.train --init-from DIR``: the start of a run from a
transformers-style checkpoint folder, as `bitexact train --init-from`
makes it (src/cli/train_ckpt_model.c, ckpt_model.c, docs/train_cli.md):
config.json (the C trainer's config.json bytes are written back), the
model as model.safetensors or shards with model.safetensors.index.json,
tensors F32, BF16 or F16 widened exactly to float32, every parameter
present (an absent e_score_correction_bias is zeros), nothing extra, no
NaN or infinity; a fresh AdamW state and the trainer state of step 0 from
the flags (the C trainer's defaults)."""
import json
import math
import os
import struct

import numpy as np

from .. import InvalidArgumentError
from ._format import FORMAT_VERSION, chex

INDEX_NAME = "model.safetensors.index.json"
_WIDTH = {"F32": 4, "BF16": 2, "F16": 2}
# `bitexact train`'s defaults (src/cli/train.c parse_args; AdamW: bx_adamw_step's)
DEFAULTS = dict(seed=0, seq_len=64, global_batch=8, lr=1e-3, weight_decay=0.01, clip=1.0,
                beta1=0.9, beta2=0.999, eps=1e-8)


def _header(path):
    """(header dict without __metadata__, data offset) of a safetensors file."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise InvalidArgumentError(f"{path}: too short for a safetensors file")
        n = struct.unpack("<Q", head)[0]
        if n > 100_000_000 or 8 + n > os.fstat(f.fileno()).st_size:
            raise InvalidArgumentError(f"{path}: header length {n} beyond the file")
        try:
            h = json.loads(f.read(n))
        except ValueError as e:
            raise InvalidArgumentError(f"{path}: invalid JSON header: {e}") from None
    if not isinstance(h, dict):
        raise InvalidArgumentError(f"{path}: the JSON header is not an object")
    h.pop("__metadata__", None)
    return h, 8 + n


class _Folder:
    """The model tensors of DIR as {name: (path, dtype, shape, offset, nbytes)}."""

    def __init__(self, d):
        single, index = os.path.join(d, "model.safetensors"), os.path.join(d, INDEX_NAME)
        if os.path.isfile(single) and os.path.isfile(index):
            raise InvalidArgumentError(f"--init-from {d}: holds both model.safetensors and "
                                       f"{INDEX_NAME} (which is the model?)")
        if not os.path.isfile(single) and not os.path.isfile(index):
            raise InvalidArgumentError(f"--init-from {d}: neither model.safetensors nor "
                                       f"{INDEX_NAME} is there")
        self.where = single if os.path.isfile(single) else INDEX_NAME
        self.t = {}
        if os.path.isfile(single):
            self._add(single, None)
            return
        try:
            with open(index, encoding="utf-8") as f:
                ix = json.load(f)
        except ValueError as e:
            raise InvalidArgumentError(f"--init-from {index}: invalid JSON: {e}") from None
        wm = ix.get("weight_map") if isinstance(ix, dict) else None
        if not isinstance(wm, dict) or not wm:
            raise InvalidArgumentError(f"--init-from {index}: \"weight_map\" is missing, empty or "
                                       "not an object")
        for n, f in wm.items():
            if not isinstance(f, str) or "/" in f or "\\" in f or f.startswith(".") or \
                    not f.endswith(".safetensors"):
                raise InvalidArgumentError(f"--init-from {index}: tensor '{n}': the file name "
                                           f"{f!r} is not a plain .safetensors file name")
        for f in sorted(set(wm.values())):
            held = self._add(os.path.join(d, f), f)
            for n in held:
                if wm.get(n) != f:
                    raise InvalidArgumentError(
                        f"--init-from {d}: {f} holds tensor '{n}', which {INDEX_NAME} "
                        + ("does not list" if n not in wm else f"puts in {wm[n]}"))
        for n, f in wm.items():
            if n not in self.t:
                raise InvalidArgumentError(f"--init-from {d}: {INDEX_NAME} puts tensor '{n}' in "
                                           f"{f}, which does not hold it")

    def _add(self, path, shard):
        if not os.path.isfile(path):
            raise InvalidArgumentError(f"--init-from {path}: cannot open (a shard {INDEX_NAME} names)")
        h, base = _header(path)
        size = os.path.getsize(path)
        for n, e in h.items():
            try:
                dt, shape, (b, end) = e["dtype"], [int(x) for x in e["shape"]], e["data_offsets"]
            except (KeyError, TypeError, ValueError):
                raise InvalidArgumentError(f"--init-from {path}: tensor '{n}': a bad entry") from None
            if not 0 <= b <= end or base + end > size:
                raise InvalidArgumentError(f"--init-from {path}: tensor '{n}': data_offsets beyond "
                                           "the file")
            self.t[n] = (path, dt, shape, base + b, end - b)
        return list(h)


def read_model(d, names, shapes):
    """{name: float32 array} of every name (model order): DIR's tensors
    checked (names, shapes, dtypes, finite) and widened; an absent
    e_score_correction_bias is zeros."""
    m = _Folder(d)
    extra = sorted(set(m.t) - set(names))
    if extra:
        path = m.t[extra[0]][0]
        raise InvalidArgumentError(f"--init-from {path}: tensor '{extra[0]}' is not a tensor of "
                                   "this model")
    out = {}
    for n in names:
        if n not in m.t:
            if n.endswith(".mlp.gate.e_score_correction_bias"):
                out[n] = np.zeros(shapes[n], dtype=np.float32)
                continue
            raise InvalidArgumentError(f"--init-from {m.where}: tensor '{n}' is missing")
        path, dt, shape, off, nbytes = m.t[n]
        if dt not in _WIDTH:
            raise InvalidArgumentError(f"--init-from {path}: tensor '{n}' is {dt}, expected F32, "
                                       "BF16 or F16")
        if tuple(shape) != tuple(shapes[n]):
            raise InvalidArgumentError(f"--init-from {path}: tensor '{n}' has shape {list(shape)}, "
                                       f"the model's is {list(shapes[n])}")
        count = int(np.prod(shape)) if shape else 1
        if nbytes != count * _WIDTH[dt]:
            raise InvalidArgumentError(f"--init-from {path}: tensor '{n}': {nbytes} bytes for "
                                       f"{dt} {list(shape)}")
        raw = np.fromfile(path, dtype=np.uint8, count=nbytes, offset=off)
        if dt == "F32":
            a = raw.view("<f4").astype(np.float32)
        elif dt == "BF16":
            a = (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            a = raw.view("<f2").astype(np.float32)  # exact: every F16 is an F32
        bad = np.flatnonzero(~np.isfinite(a))
        if bad.size:
            raise InvalidArgumentError(f"--init-from {path}: tensor '{n}' holds a NaN or an "
                                       f"infinity (element {int(bad[0])})")
        out[n] = a.reshape(shape)
    return out


def hub_shapes(cfg, names):
    """{name: shape} of the model's tensors (train_model.c)."""
    H, V, D = cfg.hidden_size, cfg.vocab_size, cfg.head_dim
    q, kv = cfg.num_attention_heads * D, cfg.num_key_value_heads * D
    I, E = cfg.moe_intermediate_size, cfg.n_routed_experts
    S = I * cfg.n_shared_experts
    out = {}
    for n in names:
        if n in ("model.embed_tokens.weight", "lm_head.weight"):
            s = (V, H)
        elif n.endswith(("q_proj.weight",)):
            s = (q, H)
        elif n.endswith(("k_proj.weight", "v_proj.weight")):
            s = (kv, H)
        elif n.endswith("q_proj.bias"):
            s = (q,)
        elif n.endswith(("k_proj.bias", "v_proj.bias")):
            s = (kv,)
        elif n.endswith("o_proj.weight"):
            s = (H, q)
        elif n.endswith(("q_norm.weight", "k_norm.weight")):
            s = (D,)
        elif n.endswith("layernorm.weight") or n == "model.norm.weight":
            s = (H,)
        elif ".mlp.experts." in n:
            s = (H, I) if n.endswith("down_proj.weight") else (I, H)
        elif ".mlp.shared_experts." in n:
            s = (H, S) if n.endswith("down_proj.weight") else (S, H)
        elif n.endswith("mlp.gate.weight"):
            s = (E, H)
        elif n.endswith("e_score_correction_bias"):
            s = (E,)
        else:  # the dense MLP
            Dn = cfg.intermediate_size
            s = (H, Dn) if n.endswith("down_proj.weight") else (Dn, H)
        out[n] = s
    return out


def _real(d):
    """tr_config_save's number: the shortest %.*g that reads back, with
    ".0" when it has neither a '.' nor an exponent."""
    for p in range(1, 18):
        s = "%.*g" % (p, d)
        if float(s) == d:
            break
    if not any(c in s for c in ".eEn"):
        s += ".0"
    return s


def _value(v, indent):
    if isinstance(v, bool) or v is None or isinstance(v, (int, str, list)):
        return json.dumps(v, separators=(",", ":"))
    if isinstance(v, float):
        return _real(v)
    keys = sorted(v)
    inner = ",\n".join(" " * (indent + 2) + json.dumps(k) + ": " + _value(v[k], indent + 2)
                       for k in keys)
    return "{\n" + inner + "\n" + " " * indent + "}"


def config_text(cfg, raw):
    """The bytes of tr_config_save (src/cli/train_config.c) for cfg (the
    model's fields) and raw (config.json: initializer_range, which the
    model does not read; Glm4MoeConfig's default 0.02)."""
    r = {"architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe",
         "torch_dtype": "float32", "attention_dropout": 0.0, "rope_scaling": None,
         "use_cache": True, "hidden_act": cfg.hidden_act,
         "rope_parameters": {"rope_type": "default", "rope_theta": float(cfg.rope_theta),
                             "partial_rotary_factor": float(cfg.partial_rotary_factor)}}
    for k in ("vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size",
              "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
              "max_position_embeddings", "first_k_dense_replace", "n_routed_experts",
              "num_experts_per_tok", "n_shared_experts", "n_group", "topk_group"):
        r[k] = int(getattr(cfg, k))
    for k in ("attention_bias", "use_qk_norm", "norm_topk_prob", "tie_word_embeddings"):
        r[k] = bool(getattr(cfg, k))
    for k in ("partial_rotary_factor", "rope_theta", "rms_norm_eps", "routed_scaling_factor"):
        r[k] = float(getattr(cfg, k))
    ir = raw.get("initializer_range")
    r["initializer_range"] = float(0.02 if ir is None else ir)
    return _value(r, 0) + "\n"


def check_config(d, raw):
    """What the C trainer refuses beyond _model.config: model_type by name,
    PaddleFormers' router keys."""
    mt = raw.get("model_type", "glm4_moe")
    if mt != "glm4_moe":
        raise InvalidArgumentError(f"--init-from {d}: config.json: model_type {mt!r} is not "
                                   "supported (only \"glm4_moe\", the GLM-4.5 MoE model)")
    for k, want in (("scoring_func", "sigmoid"), ("topk_method", "noaux_tc")):
        if raw.get(k) not in (None, want):
            raise InvalidArgumentError(f"--init-from {d}: config.json: {k}: only {want!r} is "
                                       "supported (GLM-4.5's router)")


def initial_state(a, data, dtype):
    """trainer_state.json of step 0 as `bitexact train --steps 0 --save`
    writes it for these flags."""
    return {"format_version": FORMAT_VERSION, "step": 0, "seed": str(a.seed),
            "data": {"seq_len": data.seq_len, "global_batch": a.global_batch,
                     "shuffle": bool(a.shuffle), "kind": data.kind, "tokens": data.ntokens,
                     "sequences": data.nseq, "position": 0},
            "lr_schedule": {"kind": "constant", "lr": chex(a.lr)},
            "adamw": {"beta1": chex(DEFAULTS["beta1"]), "beta2": chex(DEFAULTS["beta2"]),
                      "eps": chex(DEFAULTS["eps"]), "weight_decay": chex(a.weight_decay)},
            "clip": chex(a.clip), "mode": "invariant", "compute_dtype": dtype}


def check_finite_flag(name, v):
    if v is not None and (not math.isfinite(v) or v < 0):
        raise InvalidArgumentError(f"{name}: {v!r} is not a finite number >= 0")
