"""``python -m bitexact.train --trace FILE [--dump KEY]``: the trace of
`bitexact train --trace` (docs/trace.md), byte for byte, from the torch or
Paddle model through the framework's tracer (bitexact.torch.trace /
bitexact.paddle.trace: module hooks, per-sequence slices of the
token-major ``[B*L, H]`` activations), with what the C trainer's writer
(src/cli/train_trace.c) fixes besides the hooks:

- the root (its output is the micro-batch's loss) is not hooked;
- the header's model id is the XXH3-64 of the whole model's parameter
  names and shapes in the hub order (train_model.c's, ``hub_order``) and
  that of the config fields no shape shows (:func:`config_text`), the
  producer ``bitexact train VERSION``;
- only the pass that stands is traced (a step that falls back to two
  passes drops the first's entries);
- the gradients (before clipping) in the reverse of the hub order, the
  updated parameters in the hub order; rank 0 the dense ones, the rank of
  EP group 0 that holds an expert that expert's;
- with several ranks, rank 0 gathers every rank's entries (one exact
  integer all-reduce of their bytes over the run's comm) and writes.
"""
import json
import os
import warnings

import numpy as np

from .. import InvalidArgumentError, __version__, _comm_args
from .. import _trace
from . import _model as _gm

_TENSOR_ORDER = 1 << 40  # tensors sort after every module of their phase (train_trace.c)


def config_text(c):
    """The config fields no parameter shape shows, as train_trace.c's
    tt_config_text writes them (the model id's last part)."""
    return (f"partial_rotary_factor={float(c.partial_rotary_factor).hex()};"
            f"rope_theta={float(c.rope_theta).hex()};rms_norm_eps={float(c.rms_norm_eps).hex()};"
            f"num_experts_per_tok={int(c.num_experts_per_tok)};n_group={int(c.n_group)};"
            f"topk_group={int(c.topk_group)};norm_topk_prob={int(bool(c.norm_topk_prob))};"
            f"routed_scaling_factor={float(c.routed_scaling_factor).hex()};")


class RunTrace:
    def __init__(self, run, fw, path, dump, hub_names):
        if run.a.compile:
            raise InvalidArgumentError("--trace with --compile: the trace's module hooks do not "
                                       "run under torch.compile(fullgraph=True); trace without it")
        self.run, self.fw = run, fw
        # torch warns once that the embedding's hook sees no input gradient (its input is ids)
        warnings.filterwarnings("ignore", message="Full backward hook is firing")
        self.order = [n for n in hub_names if not n.endswith("e_score_correction_bias")]
        self.index = {n: i for i, n in enumerate(self.order)}
        local = {n: tuple(int(d) for d in p.shape) for n, p in run.params}
        mid = _trace.model_id("Glm4MoeForCausalLM", [(n, self._shape(n, local)) for n in self.order])
        mid += ":" + _trace._xxh(config_text(run.cfg).encode())
        # rank 0 writes the file; the others compute their entries (their header to nowhere)
        self.t = fw.tracer(run.model, path if run.rank == 0 else os.devnull, seq_len=run.L,
                           include_root=False, model=mid, producer=f"bitexact train {__version__}",
                           dump=dump)
        self.t.w.step = run.start  # the run's step numbers (--resume)
        if run.rank != 0:
            self.t.w.dump_path = path + ".dump.safetensors"
        E = run.ep.E if run.ep is not None else 1
        nl = run.cfg.n_routed_experts // E
        self.mine = []  # (name, parameter) of the entries this rank writes
        for n, p in run.params:
            if _gm.is_expert(n) and E > 1:
                if run.rank == int(n.split(".mlp.experts.")[1].split(".")[0]) // nl:
                    self.mine.append((n, p))
            elif run.rank == 0:
                self.mine.append((n, p))
        self.mine.sort(key=lambda t: self.index[t[0]])

    @staticmethod
    def _shape(name, local):
        if name in local:
            return local[name]
        head, tail = name.split(".mlp.experts.")  # another rank's expert: a held one's shape
        rest = tail.split(".", 1)[1]
        for n, s in local.items():
            if n.startswith(head + ".mlp.experts.") and n.endswith("." + rest):
                return s
        raise InvalidArgumentError(f"--trace: no shape for {name}")

    def micro_batch(self, i, first_seq):
        """Before micro-batch i (its first global sequence): a new pass at
        i == 0 drops what an earlier pass of the step traced."""
        if i == 0:
            self.t.discard()
        self.t.seq_offset = first_seq

    def _add(self, phase, what, items):
        for n, p in items:
            v = self.fw.grad(p) if what == "grad" else p
            a, dt = self.t._float_array(v)
            self.t.w.add(phase, n, what, None, a, dt)

    def grads(self):
        """The reduced gradients, before clipping."""
        self._add("backward", "grad", reversed(self.mine))

    def end_step(self):
        """The updated parameters, then the step's lines (every rank calls it)."""
        self._add("optimizer", "param", self.mine)
        self.t.end_step(self._merge if self.run.world > 1 else None)

    def _merge(self, lines):
        payload = json.dumps([[list(k), ln] for k, ln in lines]).encode()
        got = self._gather(payload)
        if got is None:
            return None
        out = []
        for b in got:
            for k, ln in json.loads(b):
                if k[3] in ("grad", "param"):  # a rank-independent order: the hub's
                    n = json.loads(ln)["module"]
                    i = self.index[n]
                    k = [k[0], _TENSOR_ORDER + (len(self.order) - 1 - i if k[3] == "grad" else i),
                         -1, k[3]]
                out.append((tuple(k), ln))
        return out

    def _gather(self, payload):
        """Every rank's bytes on rank 0 (None elsewhere): one exact int64
        sum of the sizes, one of the bytes, each rank's in its own words."""
        run = self.run
        fn, _ = _comm_args(run.comm)
        P, r = run.world, run.rank

        def allreduce(words):
            buf = bytearray(words.tobytes())
            res = fn(buf, "sum")
            return np.frombuffer(bytes(res if res is not None else buf), dtype=np.int64)
        sizes = np.zeros(P, dtype=np.int64)
        sizes[r] = len(payload)
        sizes = allreduce(sizes)
        words = (sizes + 7) // 8
        off = np.concatenate([[0], np.cumsum(words)])
        buf = np.zeros(int(off[-1]), dtype=np.int64)
        mine = np.frombuffer(payload + b"\0" * (int(words[r]) * 8 - len(payload)), dtype=np.int64)
        buf[off[r]:off[r + 1]] = mine
        allb = allreduce(buf).tobytes()
        if r != 0:
            return None
        return [allb[int(off[q]) * 8:int(off[q]) * 8 + int(sizes[q])] for q in range(P)]

    def close(self):
        self.t.close()
