"""Expert parallelism for the MoE block of the framework bindings
(docs/train_python.md, "Expert parallelism"): the communicator of the
model module's MoE node (src/glm/glm_moe.h, glm_ep). The node itself
sends the rows to their experts' ranks, orders them, runs the held
experts, sends the results back and adds the held experts' weight
gradients, exactly as `bitexact train` does (the same C code); this class
only moves bytes for it.

EP groups of E consecutive ranks; EP rank d holds experts [d*nl,
(d+1)*nl), nl = n_routed_experts / E. The node calls, in the same order
on every rank of a group:

- ``alltoall_i64(send, recv)``: one int64 to every EP peer, one from each
  (memoryviews of E * 8 bytes, the node's buffers, valid during the call);
- ``alltoallv(send, sbytes, recv, rbytes)``: sbytes[p] bytes (consecutive
  in send) to peer p, rbytes[p] from it into recv.

Both go through the framework's all-to-all over the EP group when the
trainer gives one (``alltoall=``: torch.distributed.all_to_all_single on
gloo); else (Paddle on the CPU) through an all-to-all built on the int64
SUM all-reduce of a :class:`bitexact.Comm`: every rank writes the bytes it
sends into its own slot of a zeroed buffer and the all-reduce delivers
every slot (one writer per word: exact for any bit pattern), moving
world-size times the bytes of a true all-to-all. The bits do not depend
on which.
A model built with this object (``expert_parallel=``) holds only its
rank's experts (:meth:`own` marks their weights); a GradReduction given
it reduces their gradient words over the replicas only
(:meth:`replica_comm`: the ranks of the same EP rank), the rest over all
ranks, as `bitexact train` does.

Threading: one thread per rank; the callbacks run in the thread that
called the node (which takes the GIL for them).
"""
import numpy as np

from .. import InvalidArgumentError, _comm_args
from . import _gradred as _g


class ExpertParallel:
    """The expert-parallel layout of one process: ``ExpertParallel(comm,
    rank, world, ep, n_experts)``; ``local_tokens`` (the tokens of one rank
    per step, the same on every rank) must be set before a step.
    ``holds(e)``: whether this rank computes expert e. ``size``, ``rank``
    (the EP rank), ``local_tokens``, :meth:`alltoall_i64` and
    :meth:`alltoallv` are what the MoE node reads."""

    def __init__(self, comm, rank, world, ep, n_experts, alltoall=None, replica=None):
        if ep < 1 or world % ep or n_experts % ep:
            raise InvalidArgumentError(f"--ep {ep}: must divide the ranks ({world}) and "
                                       f"n_routed_experts ({n_experts})")
        self.fn, _ = _comm_args(comm)
        self._replica = replica  # the comm over the ranks of this EP rank, or None (emulated)
        self._local = set()  # ids of the held experts' parameters (own())
        self.world_rank, self.world, self.E, self.NE = rank, world, ep, n_experts
        self.d, self.g0 = rank % ep, rank - rank % ep  # EP rank; the group's first world rank
        self.nl = n_experts // ep
        self.first = self.d * self.nl
        self.size, self.rank = ep, self.d  # the node's glm_ep
        self.local_tokens = None  # tokens per rank per step: set by the trainer
        self._a2a = alltoall  # the framework's all-to-all over the EP group, or None
        _g.register(self)  # self._bx_key: how a torch.compile'd graph names it

    def holds(self, e):
        return e // self.nl == self.d

    def own(self, params):
        """Mark params as held experts' weights: a GradReduction given this
        object reduces their gradients over the replicas only
        (:meth:`replica_comm`), as `bitexact train` does."""
        self._local.update(id(p) for p in params)

    def is_local(self, p):
        return id(p) in self._local

    def replica_comm(self):
        """(allreduce function or None, rank) over the P/E ranks with this
        EP rank (one per EP group: the ranks that hold the same experts),
        for GradRed's xcomm: the trainer's ``replica=`` comm, else an
        all-reduce over the whole comm in which each EP rank fills its own
        slot (exact; E times the words). None with P == E (one replica)."""
        R = self.world // self.E
        if R == 1:
            return None, 0
        if self._replica is not None:
            return _comm_args(self._replica)
        E, d = self.E, self.d
        lowest = np.iinfo(np.int64).min

        def allreduce(buf, op):
            w = np.frombuffer(bytes(buf), dtype=np.int64)
            slots = np.full((E, w.size), 0 if op == "sum" else lowest, dtype=np.int64)
            slots[d] = w  # the other EP ranks' slots: the identity of op
            b = bytearray(slots.tobytes())
            r = self.fn(b, op)
            buf[:] = np.frombuffer(bytes(b if r is None else r), dtype=np.int64) \
                .reshape(E, -1)[d].tobytes()
        return allreduce, self.world_rank // E

    def alltoall_i64(self, send, recv):
        """One int64 of send to each EP peer; recv[p] := peer p's."""
        if self._a2a is not None:
            recv[:] = self._a2a(send, [8] * self.E, [8] * self.E).tobytes()
            return
        got = self._exchange([bytes(send[8 * p:8 * p + 8]) for p in range(self.E)])
        recv[:] = b"".join(b[:8] for b in got)

    def alltoallv(self, send, sbytes, recv, rbytes):
        """sbytes[p] bytes of send (consecutive) to peer p; recv := the
        bytes each peer sent here, peer by peer (rbytes[p] from p)."""
        if self._a2a is not None:
            recv[:] = self._a2a(send, sbytes, rbytes).tobytes()
            return
        sends, a = [], 0
        for n in sbytes:
            sends.append(bytes(send[a:a + n]))
            a += n
        got = self._exchange(sends)
        recv[:] = b"".join(b[:n] for b, n in zip(got, rbytes))

    def _exchange(self, sends):
        """sends[p]: the bytes for EP peer p (p < E). Returns recv[p], the
        bytes peer p sent here (padded to whole int64 words)."""
        W = self.world
        sizes = np.zeros((W, W), dtype=np.int64)
        for p, b in enumerate(sends):
            sizes[self.world_rank, self.g0 + p] = -(-len(b) // 8) * 8
        sizes = self._sum(sizes)
        off = np.concatenate([[0], np.cumsum(sizes.reshape(-1))]).astype(np.int64)
        buf = np.zeros(int(off[-1]) // 8, dtype=np.int64)
        raw = buf.view(np.uint8)
        for p, b in enumerate(sends):
            o = int(off[self.world_rank * W + self.g0 + p])
            raw[o:o + len(b)] = np.frombuffer(b, dtype=np.uint8)
        raw = self._sum(buf).view(np.uint8)
        return [raw[int(off[(self.g0 + p) * W + self.world_rank]):
                    int(off[(self.g0 + p) * W + self.world_rank + 1])].tobytes()
                for p in range(self.E)]

    def _sum(self, a):
        buf = bytearray(np.ascontiguousarray(a, dtype=np.int64).tobytes())
        r = self.fn(buf, "sum")
        return np.frombuffer(bytes(r if r is not None else buf), dtype=np.int64).reshape(a.shape).copy()
