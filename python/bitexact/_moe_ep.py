"""Expert parallelism for the MoE block of the framework bindings (the
Python counterpart of src/cli/train_moe_ep.c; docs/train_python.md,
"Expert parallelism"). Framework-neutral: it works on numpy arrays (the
kernels take them through DLPack) and moves bytes through a
:class:`bitexact.Comm` (the int64 all-reduce of torch.distributed or
paddle.distributed), so both bindings run the same code.

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

from . import Error, InvalidArgumentError, _comm_args
from . import kernels as _k
from ._gradred import _active, _renamed, bf16_round


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
        self.rows = EPRows(self)  # what the MoE block calls (moe(..., expert_parallel=self))

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

    # ---- forward ------------------------------------------------------------

    def forward(self, xp, offsets, row_tok, weights, nt, cast=None):
        """xp [R, H] float32 (rows by (expert, token)), offsets [NE + 1],
        row_tok [R] the rows' global token ids, weights[e] = (W_g, W_u, W_d)
        numpy arrays for every held expert e; cast: None (fp32) or the bf16
        rounding of a numpy array into a framework tensor (bf16 compute).
        Returns (yp [R, H], saved)."""
        H, NE, nl = xp.shape[1], self.NE, self.nl
        eid = np.repeat(np.arange(NE, dtype=np.int64), np.diff(offsets))
        sends, cnt = [], []
        for p in range(self.E):
            a, b = int(offsets[p * nl]), int(offsets[(p + 1) * nl])
            meta = np.stack([eid[a:b], row_tok[a:b]], axis=1).astype(np.int64)
            sends.append(meta.tobytes() + np.ascontiguousarray(xp[a:b]).tobytes())
            cnt.append(b - a)
        recv = self._exchange(sends)
        metas, rows, rcnt = [], [], []
        for b in recv:
            n = len(b) // (16 + 4 * H)
            metas.append(np.frombuffer(b[:16 * n], dtype=np.int64).reshape(n, 2))
            rows.append(np.frombuffer(b[16 * n:16 * n + 4 * H * n], dtype=np.float32).reshape(n, H))
            rcnt.append(n)
        meta = np.concatenate(metas) if metas else np.zeros((0, 2), np.int64)
        rbuf = np.concatenate(rows) if rows else np.zeros((0, H), np.float32)
        n = rbuf.shape[0]
        off = np.zeros(nl + 1, dtype=np.int64)
        order = np.zeros(n, dtype=np.int64)
        if n:
            e_loc = np.ascontiguousarray(meta[:, 0] - self.first)
            tin = np.ascontiguousarray(meta[:, 1])
            _k.moe_dispatch_order(e_loc, tin, off, order)
        xr = np.ascontiguousarray(rbuf[order])
        tok = meta[order, 1].copy() if n else np.zeros(0, np.int64)
        ws = [weights[self.first + le] for le in range(nl)]
        I = ws[0][0].shape[0]
        gr, ur, hr = (np.empty((n, I), np.float32) for _ in range(3))
        dr = np.empty((n, H), np.float32)
        o = off.tolist()
        for le, (wg, wu, wd) in enumerate(ws):
            a, b = o[le], o[le + 1]
            if a == b:
                continue
            _mm(cast, xr[a:b], wg, "nt", gr[a:b], num_threads=nt)
            _mm(cast, xr[a:b], wu, "nt", ur[a:b], num_threads=nt)
            _k.swiglu_forward(gr[a:b], ur[a:b], hr[a:b], num_threads=nt)
            _mm(cast, hr[a:b], wd, "nt", dr[a:b], num_threads=nt)
        yp = self._back(dr, order, rcnt, cnt, H)
        return yp, dict(order=order, off=o, xr=xr, gr=gr, ur=ur, hr=hr, tok=tok, rcnt=rcnt,
                        cnt=cnt, ws=ws)

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
        out = np.concatenate([np.frombuffer(b[:4 * H * c], dtype=np.float32).reshape(c, H)
                              for b, c in zip(got, cnt)]) if cnt else np.zeros((0, H), np.float32)
        return np.ascontiguousarray(out)

    # ---- backward -------------------------------------------------------------

    def backward(self, dyp, st, nt, cast=None):
        """dyp [R, H] (the sender's rows) -> dxp [R, H]; keeps in st the
        held experts' weight-gradient factors for :meth:`wgrads`."""
        H = dyp.shape[1]
        parts, a = [], 0
        for c in st["cnt"]:
            parts.append(np.ascontiguousarray(dyp[a:a + c]).tobytes())
            a += c
        got = self._exchange(parts)
        rb = np.concatenate([np.frombuffer(b[:4 * H * c], dtype=np.float32).reshape(c, H)
                             for b, c in zip(got, st["rcnt"])]) if got else np.zeros((0, H), np.float32)
        order, o, n = st["order"], st["off"], len(st["order"])
        dyr = np.ascontiguousarray(rb[order]) if n else np.zeros((0, H), np.float32)
        I = st["gr"].shape[1]
        dhr, dgr, dur = (np.empty((n, I), np.float32) for _ in range(3))
        dr = np.empty((n, H), np.float32)
        for le, (wg, wu, wd) in enumerate(st["ws"]):
            a, b = o[le], o[le + 1]
            if a == b:
                continue
            _mm(cast, dyr[a:b], wd, "nn", dhr[a:b], num_threads=nt)
            _k.swiglu_backward(st["gr"][a:b], st["ur"][a:b], dhr[a:b], dgr[a:b], dur[a:b],
                               num_threads=nt)
            _mm(cast, dgr[a:b], wg, "nn", dr[a:b], num_threads=nt)
            _mm(cast, dur[a:b], wu, "nn", dr[a:b], accumulate=True, num_threads=nt)
        st.update(dyr=dyr, dgr=dgr, dur=dur)
        return self._back(dr, order, st["rcnt"], st["cnt"], H)

    def wgrads(self, mb, eidx, st, cast=None):
        """train_moe_ep.c's wg_expert for every held expert weight (eidx[e]:
        the GradReduction state indices (gate, up, down) of expert e, or
        None), after :meth:`backward`."""
        dyr, dgr, dur = st["dyr"], st["dgr"], st["dur"]
        red = mb.red
        s, C = red._state, red.seq_len
        nch, lc = mb.T // C, self.local_chunks
        cb0 = mb.chunk0 - self.d * lc  # peer p's micro-batch: chunks cb0 + p*lc, nch of them
        span = (self.E - 1) * lc + nch
        bound = mb.check("MoE backward (expert parallel)")
        o, tok = st["off"], st["tok"]
        bd = np.zeros(span + 1, dtype=np.int64)
        try:
            for le in range(self.nl):
                r0, r1 = o[le], o[le + 1]
                idx3 = eidx[self.first + le]
                if r1 > r0:
                    _k.moe_expert_chunks(np.ascontiguousarray(tok[r0:r1]), C, cb0, bd)
                    b = bd.tolist()
                else:
                    b = [0] * (span + 1)
                for i, dy, x in zip(idx3, (dgr, dur, dyr), (st["xr"], st["xr"], st["hr"])):
                    if i is None:
                        continue
                    for ch in (p * lc + j for p in range(self.E) for j in range(nch)):
                        a, e = r0 + b[ch], r0 + b[ch + 1]
                        if bound:
                            if a < e:
                                ma, mx = _max_abs(dy[a:e]), _max_abs(x[a:e])
                                if cast is not None:  # the bound of the rounded operands
                                    ma, mx = bf16_round(ma), bf16_round(mx)
                                s.bound_exp(i, _k.wgrad_bound_exp(e - a, ma, mx))
                            continue
                        part = np.zeros((dy.shape[1], x.shape[1]), np.float32)
                        if a < e:
                            _mm(cast, dy[a:e], x[a:e], "tn", part, num_threads=red.num_threads)
                        s.add(i, cb0 + ch, part)
        except Error as err:
            raise _renamed(err, red.names) from err


class EPRows:
    """The expert stage of bitexact._moe_ops's MoE block (its ``rows``)
    through an :class:`ExpertParallel`: framework tensors in and out (the
    adapter's ``from_numpy``), numpy inside."""

    def __init__(self, ep):
        self.ep = ep

    def forward(self, fw, xp, off, ews, nt, row_map, bf=False):
        red = _active()
        mb = red._mb if red is not None else None
        if mb is None:
            raise InvalidArgumentError("MoE (expert parallel): the block must run inside a "
                                       "GradReduction micro-batch (the rows' global token ids)")
        tok = np.asarray(row_map.numpy())[:, 0] + mb.tok0
        ep = self.ep
        weights = {e: tuple(np.asarray(w.detach().numpy()) for w in ews[e])
                   for e in range(ep.first, ep.first + ep.nl)}
        yp, st = ep.forward(np.asarray(xp.numpy()), np.asarray(off, dtype=np.int64), tok,
                            weights, nt, _cast(fw, bf))
        st["fw"] = fw
        return fw.from_numpy(yp), st

    def backward(self, fw, dyp, st, nt, bf=False):
        return fw.from_numpy(self.ep.backward(np.asarray(dyp.numpy()), st, nt, _cast(fw, bf)))

    def wgrads(self, mb, eidx, st, bf=False):
        self.ep.wgrads(mb, eidx, st, _cast(st["fw"], bf))


def _cast(fw, bf):
    """bf16 compute: a numpy array rounded into a framework bf16 tensor."""
    return (lambda a: fw.bf16(fw.from_numpy(np.ascontiguousarray(a)))) if bf else None


def _mm(cast, a, b, layout, c, accumulate=False, num_threads=0):
    """bx_gemm, the operands rounded by cast first (bf16 compute)."""
    if cast is not None:
        a, b = cast(a), cast(b)
    _k.gemm(a, b, layout, c, accumulate=accumulate, num_threads=num_threads)


def _max_abs(a):
    """max |a| over the finite elements, 0 if none (exact)."""
    v = np.abs(a[np.isfinite(a)])
    return float(v.max()) if v.size else 0.0
