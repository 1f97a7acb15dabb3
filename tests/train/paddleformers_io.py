"""PaddleFormers' GLM-4.5 (Glm4MoeForCausalLMDeprecated, PaddleFormers
1.2.0 on CPU) for tests/train/test_init_from.py, run as its own process
(PaddleFormers turns transformers' torch support off in the process that
imports it):

  python3 paddleformers_io.py save CONFIG.json OUT_DIR MAX_SHARD_SIZE SEED
      a model of CONFIG (its own initialisation, e_score_correction_bias
      set to random values) written by save_pretrained(OUT_DIR,
      max_shard_size=...): shards with an index, the router in BF16
  python3 paddleformers_io.py trace DIR BATCH.npy OUT.trace MODEL_ID [DUMP_KEY]
      Glm4MoeForCausalLMDeprecated.from_pretrained(DIR) in fp32, train
      mode: one forward (input_ids = BATCH[:, :-1], a [B, L+1] int64
      batch) and backward of the token-mean cross-entropy against
      BATCH[:, 1:] (the loss of ref_transformers.loss_and_grads), traced
      by bitexact.paddle.trace (seq_len L, include_root=False, model=
      MODEL_ID, dump= DUMP_KEY) and one Tracer.step() with no update;
      prints "TRACED <loss as a hex float>"
  python3 paddleformers_io.py load DIR
      Glm4MoeForCausalLMDeprecated.from_pretrained(DIR); prints one line
      "LOADED <json>" with the messages of PaddleFormers' logger, Python's
      warnings and the number of tensors of the state dict (PaddleFormers'
      loader reports unexpected or missing keys on stderr through a logger
      of its own: the caller reads the whole output)

Two modules are stubbed, as PaddleFormers' CPU use needs: paddlefleet
(GPU training: gpt_provider's GPTModelProvider base class, paddlefleet_ops'
is_deep_ep_available) is not installable on CPU, and huggingface_hub 1.x
dropped repo_type_and_id_from_hf_id, which PaddleFormers imports for
push_to_hub only. config.fuse_rms_norm = False (the fused kernel is GPU
only)."""
import dataclasses
import json
import logging
import os
import sys
import types


def stub():
    gp = types.ModuleType("paddleformers.transformers.gpt_provider")

    @dataclasses.dataclass
    class GPTModelProvider:  # the base of GLMMoEModelProvider (paddlefleet's GPT); unused here
        transform_rules = {}

    gp.GPTModelProvider = GPTModelProvider
    sys.modules["paddleformers.transformers.gpt_provider"] = gp
    ops = types.ModuleType("paddlefleet_ops")
    ops.is_deep_ep_available = lambda: False
    sys.modules["paddlefleet_ops"] = ops
    import huggingface_hub
    if not hasattr(huggingface_hub, "repo_type_and_id_from_hf_id"):
        def no_hub(*a, **k):
            raise NotImplementedError("push_to_hub is not available in this test")
        huggingface_hub.repo_type_and_id_from_hf_id = no_hub


class Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def main(argv):
    stub()
    import paddle
    paddle.set_device("cpu")
    from paddleformers.transformers.glm4_moe.configuration import Glm4MoeConfig
    from paddleformers.transformers.glm4_moe.modeling import Glm4MoeForCausalLMDeprecated
    from paddleformers.utils.log import logger
    if argv[0] == "save":
        cfg_path, out, size, seed = argv[1], argv[2], argv[3], int(argv[4])
        with open(cfg_path) as f:
            c = Glm4MoeConfig(**json.load(f))
        c.fuse_rms_norm = False
        paddle.seed(seed)
        m = Glm4MoeForCausalLMDeprecated(c)
        for n, b in list(m.named_buffers()) + list(m.named_parameters()):
            if n.endswith("e_score_correction_bias"):
                b.set_value(0.2 * (paddle.rand(b.shape, dtype=b.dtype) - 0.5))
        m.save_pretrained(out, max_shard_size=size)
        print("SAVED " + json.dumps(sorted(os.listdir(out))))
        return 0
    if argv[0] == "trace":
        import numpy as np
        import bitexact.paddle as bp
        d, batch_path, out, model_id = argv[1:5]
        dump = argv[5] if len(argv) > 5 else None
        c = Glm4MoeConfig.from_pretrained(d)
        c.fuse_rms_norm = False
        m = Glm4MoeForCausalLMDeprecated.from_pretrained(d, config=c, dtype="float32")
        m.train()
        batch = paddle.to_tensor(np.load(batch_path).astype(np.int64))
        L = batch.shape[1] - 1
        with bp.trace(m, out, seq_len=L, include_root=False, model=model_id, dump=dump) as t:
            logits = m(input_ids=batch[:, :-1], use_cache=False, return_dict=True).logits
            loss = paddle.nn.functional.cross_entropy(
                logits.astype("float32").reshape([-1, logits.shape[-1]]), batch[:, 1:].reshape([-1]),
                reduction="mean")
            loss.backward()
            t.step()
        print("TRACED " + float(loss).hex())
        return 0
    if argv[0] == "load":
        h = Collect()
        for lg in (logger.logger if hasattr(logger, "logger") else logger, logging.getLogger()):
            try:
                lg.addHandler(h)
            except AttributeError:
                pass
        import warnings
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            c = Glm4MoeConfig.from_pretrained(argv[1])
            c.fuse_rms_norm = False
            m = Glm4MoeForCausalLMDeprecated.from_pretrained(argv[1], config=c)
        sd = m.state_dict()
        print("LOADED " + json.dumps({"log": h.lines, "warnings": [str(x.message) for x in w],
                                      "n": len(sd)}))
        return 0
    raise SystemExit(f"unknown command {argv[0]}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
