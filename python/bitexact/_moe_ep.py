"""Expert parallelism for the MoE block of the framework bindings (the
Python counterpart of src/glm/train_moe_ep.c; docs/train_python.md,
"Expert parallelism"). Framework-neutral: the rows travel as numpy
bytes through a :class:`bitexact.Comm` (the int64 all-reduce of
torch.distributed or paddle.distributed); the experts' forward, backward
and weight gradients are bitexact._moe_ops's (experts_rows_forward /
_backward, expert_wgrads) on the framework's tensors, so both bindings
and the one-process block run the same code.

EP groups of E consecutive ranks; EP rank d holds experts [d*nl,
(d+1)*nl), nl = n_routed_experts / E. Per MoE layer and micro-batch:

forward  the local rows (sorted by (expert, token): the rows for EP rank
         d are one contiguous range) travel with their (expert, global
         token id) to the expert's rank; the receiver orders them by
         (expert, global token) with bx_moe_dispatch_order (the order one
         process holding the whole batch builds), runs its experts
         (row-wise batch-invariant GEMMs and SwiGLU: each row has the bits
         of one process) and sends each row's output back to its sender,
         in the order it was sent;
backward the output gradients go the same way, the input gradients come
         back; the held experts' weight gradients are per global chunk (one
         sequence) over the expert's rows of that chunk, for the chunks of
         every EP peer's current micro-batch (a zero partial for a chunk
         that sent the expert nothing): the addends of one process.

The exchange is an all-to-all built on the int64 all-reduce: every rank
writes the bytes it sends into its own slot of a zeroed buffer and the
SUM all-reduce delivers every slot (one writer per word: exact for any bit
pattern). It moves world-size times the bytes of a true all-to-all; the
bits do not depend on it. The gradient words of an expert are reduced
with the dense ones over all ranks (a rank that does not hold the expert
adds nothing to them), so every rank ends the step with every gradient.

Threading: one thread per rank; every rank calls the exchanges in the
same order (the forward and backward of the same layers and micro-batches).
"""
import numpy as np

from . import InvalidArgumentError, _comm_args
from . import _gradred as _g
from . import _moe_ops as _mo
from . import kernels as _k
from ._gradred import _active


class ExpertParallel:
    """The expert-parallel layout of one process: ``ExpertParallel(comm,
    rank, world, ep, n_experts)``; ``local_chunks`` (the sequences of one
    rank per step) must be set before a backward. ``holds(e)``: whether
    this rank computes expert e."""

    def __init__(self, comm, rank, world, ep, n_experts):
        if ep < 1 or world % ep or n_experts % ep:
            raise InvalidArgumentError(f"--ep {ep}: must divide the ranks ({world}) and "
                                       f"n_routed_experts ({n_experts})")
        self.fn, _ = _comm_args(comm)
        self.rank, self.world, self.E, self.NE = rank, world, ep, n_experts
        self.d, self.g0 = rank % ep, rank - rank % ep  # EP rank; the group's first world rank
        self.nl = n_experts // ep
        self.first = self.d * self.nl
        self.a2a_bytes = 0  # bytes this rank sent (a true all-to-all's count), cumulative
        self.local_chunks = None  # chunks (sequences) per rank per step: set by the trainer
        self.rows = self  # the MoE block's expert stage (moe(..., expert_parallel=self))
        _g.register(self)  # self._bx_key: how a torch.compile'd graph names it

    def holds(self, e):
        return e // self.nl == self.d

    def _exchange(self, sends):
        """sends[p]: the bytes for EP peer p (p < E). Returns recv[p], the
        bytes peer p sent here."""
        W, E = self.world, self.E
        sizes = np.zeros((W, W), dtype=np.int64)
        for p, b in enumerate(sends):
            sizes[self.rank, self.g0 + p] = -(-len(b) // 8) * 8
        sizes = self._sum(sizes)
        off = np.concatenate([[0], np.cumsum(sizes.reshape(-1))]).astype(np.int64)
        buf = np.zeros(int(off[-1]) // 8, dtype=np.int64)
        raw = buf.view(np.uint8)
        for p, b in enumerate(sends):
            o = int(off[self.rank * W + self.g0 + p])
            raw[o:o + len(b)] = np.frombuffer(b, dtype=np.uint8)
            self.a2a_bytes += len(b) if p != self.d else 0
        raw = self._sum(buf).view(np.uint8)
        return [raw[int(off[(self.g0 + p) * W + self.rank]):
                    int(off[(self.g0 + p) * W + self.rank + 1])].tobytes() for p in range(E)]

    def _sum(self, a):
        buf = bytearray(np.ascontiguousarray(a, dtype=np.int64).tobytes())
        r = self.fn(buf, "sum")
        return np.frombuffer(bytes(r if r is not None else buf), dtype=np.int64).reshape(a.shape).copy()

    # ---- the MoE block's expert stage (bitexact._moe_ops: moe(..., rows=self)) ----------

    def forward(self, fw, xp, off, ews, nt, row_map, bf=False):
        """xp [R, H] (the local rows by (expert, token)), off [NE + 1], ews
        every expert's (W_g, W_u, W_d), row_map [R, 2]: the rows go to their
        experts' ranks, the held experts run on the rows received (in the
        dispatch order, by _moe_ops.experts_rows_forward), the outputs come
        back. Returns (yp [R, H], the state of backward and wgrads)."""
        red = _active()
        mb = red._mb if red is not None else None
        if mb is None:
            raise InvalidArgumentError("MoE (expert parallel): the block must run inside a "
                                       "GradReduction micro-batch (the rows' global token ids)")
        xp, H, nl = np.asarray(xp.numpy()), int(xp.shape[1]), self.nl
        row_tok = np.asarray(row_map.numpy())[:, 0] + mb.tok0
        eid = np.repeat(np.arange(self.NE, dtype=np.int64), np.diff(np.asarray(off)))
        sends, cnt = [], []
        for p in range(self.E):
            a, b = int(off[p * nl]), int(off[(p + 1) * nl])
            meta = np.stack([eid[a:b], row_tok[a:b]], axis=1).astype(np.int64)
            sends.append(meta.tobytes() + np.ascontiguousarray(xp[a:b]).tobytes())
            cnt.append(b - a)
        metas, rows, rcnt = [], [], []
        for b in self._exchange(sends):
            n = len(b) // (16 + 4 * H)
            metas.append(np.frombuffer(b[:16 * n], dtype=np.int64).reshape(n, 2))
            rows.append(np.frombuffer(b[16 * n:16 * n + 4 * H * n], dtype=np.float32).reshape(n, H))
            rcnt.append(n)
        meta, rbuf = np.concatenate(metas), np.concatenate(rows)
        n = rbuf.shape[0]
        loc = np.zeros(nl + 1, dtype=np.int64)
        order = np.zeros(n, dtype=np.int64)
        if n:
            _k.moe_dispatch_order(np.ascontiguousarray(meta[:, 0] - self.first),
                                  np.ascontiguousarray(meta[:, 1]), loc, order)
        ws = list(ews[self.first:self.first + nl])
        o = loc.tolist()
        dr, ract = _mo.experts_rows_forward(fw, fw.from_numpy(np.ascontiguousarray(rbuf[order])),
                                            o, ws, nt, bf)
        yp = self._back(np.asarray(dr.numpy()), order, rcnt, cnt, H)
        st = dict(order=order, off=o, ract=ract, ws=ws, rcnt=rcnt, cnt=cnt, fw=fw,
                  tok=fw.from_numpy(np.ascontiguousarray(meta[order, 1])))
        return fw.from_numpy(yp), st

    def _back(self, res, order, rcnt, cnt, H):
        """Rows in dispatch order -> received order -> each sender, in the
        order it sent them: the sender's rows [R, H]."""
        sbuf = np.empty_like(res)
        sbuf[order] = res
        parts, a = [], 0
        for n in rcnt:
            parts.append(sbuf[a:a + n].tobytes())
            a += n
        got = self._exchange(parts)
        return np.ascontiguousarray(np.concatenate(
            [np.frombuffer(b[:4 * H * c], dtype=np.float32).reshape(c, H)
             for b, c in zip(got, cnt)]))

    def backward(self, fw, dyp, st, nt, bf=False):
        """dyp [R, H] (the sender's rows) -> dxp [R, H]: the output
        gradients go to the experts' ranks, _moe_ops.experts_rows_backward
        runs there, the input gradients come back. Keeps in st the held
        experts' weight-gradient factors for :meth:`wgrads`."""
        dyp, H = np.asarray(dyp.numpy()), int(dyp.shape[1])
        parts, a = [], 0
        for c in st["cnt"]:
            parts.append(np.ascontiguousarray(dyp[a:a + c]).tobytes())
            a += c
        rb = np.concatenate([np.frombuffer(b[:4 * H * c], dtype=np.float32).reshape(c, H)
                             for b, c in zip(self._exchange(parts), st["rcnt"])])
        dyr = fw.from_numpy(np.ascontiguousarray(rb[st["order"]]))
        dr, (dgr, dur) = _mo.experts_rows_backward(fw, dyr, st["off"], st["ws"], st["ract"], nt, bf)
        st["grads"] = (dyr, dgr, dur)
        return fw.from_numpy(self._back(np.asarray(dr.numpy()), st["order"], st["rcnt"],
                                        st["cnt"], H))

    def wgrads(self, mb, eidx, st, bf=False):
        """train_moe_ep.c's wg_expert for every held expert weight (eidx[e]:
        the GradReduction state indices (gate, up, down) of expert e, or
        None), after :meth:`backward`: _moe_ops.expert_wgrads over the
        chunks of every EP peer's current micro-batch."""
        nch, lc = mb.T // mb.red.seq_len, self.local_chunks
        _mo.expert_wgrads(st["fw"], mb, eidx[self.first:self.first + self.nl], st["tok"], st["off"],
                          st["ract"], st["grads"], "MoE backward (expert parallel)", bf,
                          chunk0=mb.chunk0 - self.d * lc, span=(self.E - 1) * lc + nch,
                          chunks=[p * lc + j for p in range(self.E) for j in range(nch)])
