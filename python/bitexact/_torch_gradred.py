"""bitexact.torch's GradReduction: the weight gradients of a training step
as layout-invariant token reductions, for the layers of _torch_layers.py
(docs/torch_layers.md).

Every forward and backward value is computed by a bitexact kernel (torch
only allocates and reshapes); the bits are those of `bitexact train`'s
kernels. Weight gradients never go through torch's accumulation into
``.grad``: each module adds its per-chunk partials (one chunk = one
sequence of ``seq_len`` tokens) to the :class:`GradReduction` of the step,
which owns one ``bitexact.kernels.TokRed`` over the parameters and writes
every ``.grad`` at :meth:`GradReduction.finish`. A step is two passes of the
same forward + backward (pass 0 bounds the partials, the grid is agreed over
ranks, pass 1 adds them), so gradients and the loss are bitwise the same for
any micro-batching, thread count and data-parallel rank count.

Threading: a GradReduction is used by one thread at a time (the one running
the step); the kernels release the GIL and their own worker threads
(``num_threads``) never change a bit. Not covered here: the MoE router,
dispatch and experts, bias terms, bf16 compute, CUDA tensors.
"""
import contextlib as _contextlib
import re as _re
import threading as _threading

import torch

from . import (DeviceError, DTypeError, Error, InvalidArgumentError, LayoutError, _comm_args)
from . import kernels as _k

__all__ = ["GradReduction"]

_F32 = torch.float32
_tls = _threading.local()  # the GradReduction whose micro_batch() this thread runs


def _active():
    return getattr(_tls, "red", None)


def _err(cls, fn, name, text):
    e = cls(f"{fn}: argument '{name}': {text}")
    e.argument = name
    return e


def _check(fn, name, t, dtypes=(_F32,), ndim=None, min_ndim=1):
    """The checks every argument gets before any kernel runs (the kernels
    check again; these name the module's own argument)."""
    if not isinstance(t, torch.Tensor):
        raise _err(InvalidArgumentError, fn, name, f"is a {type(t).__name__}, not a torch.Tensor")
    if t.device.type != "cpu":
        raise _err(DeviceError, fn, name, f"is on device '{t.device}'; bitexact's training kernels "
                   "run on CPU tensors")
    if t.layout != torch.strided:
        raise _err(LayoutError, fn, name, f"has layout {t.layout}; a dense (strided) tensor is needed")
    if t.dtype not in dtypes:
        want = " or ".join(str(d).replace("torch.", "") for d in dtypes)
        raise _err(DTypeError, fn, name, f"dtype must be {want}, not {str(t.dtype).replace('torch.', '')}")
    if (ndim is not None and t.dim() not in ndim) or t.dim() < min_ndim:
        raise _err(InvalidArgumentError, fn, name, f"has shape {tuple(t.shape)}: "
                   f"{'/'.join(map(str, ndim)) if ndim else f'at least {min_ndim}'} dimensions expected")
    return t.contiguous()


def _renamed(e, names):
    """A TokRed error with 'tensor i' followed by the parameter's name."""
    msg = _re.sub(r"tensor (\d+)", lambda m: f"tensor {m.group(1)} ({names[int(m.group(1))]})"
                  if int(m.group(1)) < len(names) else m.group(0), str(e))
    n = type(e)(msg)
    n.__dict__.update(getattr(e, "__dict__", {}))
    return n


def _threads(mod_threads):
    if mod_threads is not None:
        return mod_threads
    red = _active()
    return red.num_threads if red is not None else 0


# ---- the step's gradient reduction ---------------------------------------

class GradReduction:
    """The gradients of one training step as layout-invariant token
    reductions (``bitexact_train.h`` "Token reduction").

    ``GradReduction(parameters, seq_len, total_tokens, *, num_threads=0)``:
    ``parameters`` the trained fp32 CPU parameters (Parameters or
    ``named_parameters()`` pairs, names used in messages), each used by
    exactly one bitexact module call per micro-batch; ``seq_len`` = the
    chunk: a micro-batch holds whole sequences; ``total_tokens`` the global
    batch's tokens (all micro-batches of all ranks). ``num_threads`` bounds
    the kernels' worker threads (bits never depend on it).

    The protocol, on every rank, per step (:meth:`run_two_pass` does it)::

        red.begin()                          # pass 0: bound
        for b, n, batch in my_micro_batches: # global first token, token count
            with red.micro_batch(b, n):
                model(batch).backward()      # bitexact modules bound their partials
        red.agree(comm)                      # MAX all-reduce: the grids; pass 1: add
        for b, n, batch in my_micro_batches: # the same micro-batches, same order
            with red.micro_batch(b, n):
                loss = model(batch); loss.backward()  # the same bits; partials added
        red.finish(comm)                     # SUM all-reduce of int64 words; .grad written

    ``comm``: None (one process), a :class:`bitexact.Comm`
    (``bitexact.torch.comm(group)``) or a torch.distributed process group.
    After :meth:`finish`, ``red.loss`` is the step's cross-entropy loss (the
    exact global sum / n_targets, rounded once) when the model used
    :class:`CrossEntropyLoss`. Misuse (a micro-batch outside a pass, pass 1
    with other micro-batches than pass 0, a backward of a previous pass, a
    parameter used twice in a micro-batch, finish before agree or twice)
    raises :class:`bitexact.InvalidArgumentError`; a failing call leaves every
    ``.grad`` unchanged (then :meth:`begin` a new step).
    """

    def __init__(self, parameters, seq_len, total_tokens, *, num_threads=0):
        items = list(parameters)
        names, params = [], []
        for i, it in enumerate(items):
            name, p = it if isinstance(it, tuple) else (f"parameters[{i}]", it)
            _check("GradReduction", name, p, min_ndim=0)
            if not p.is_contiguous():
                raise _err(LayoutError, "GradReduction", name, "must be contiguous")
            if not p.requires_grad:
                raise _err(InvalidArgumentError, "GradReduction", name, "does not require grad")
            names.append(name)
            params.append(p)
        index = {}
        for i, p in enumerate(params):
            if id(p) in index:
                raise _err(InvalidArgumentError, "GradReduction", names[i],
                           f"is {names[index[id(p)]]} again")
            index[id(p)] = i
        if int(seq_len) < 1 or int(total_tokens) < 1 or int(num_threads) < 0:
            raise InvalidArgumentError(f"GradReduction: seq_len {seq_len} and total_tokens "
                                       f"{total_tokens} must be >= 1, num_threads {num_threads} >= 0")
        self.names, self.params, self._index = names, params, index
        self.seq_len, self.total_tokens, self.num_threads = int(seq_len), int(total_tokens), int(num_threads)
        self.phase = "idle"  # idle -> bound -> add -> done (or failed)
        self.loss = None
        self.n_targets = self.total_tokens
        self._gen = 0
        self._state = self._loss_state = None
        self._mb = None

    # -- the passes --
    def begin(self, n_targets=None):
        """Start a step (pass 0, bound). ``n_targets``: the global count of
        targets that are not ``ignore_index`` (the loss divisor; default
        ``total_tokens``, every target valid; :meth:`count_targets`)."""
        n = self.total_tokens if n_targets is None else int(n_targets)
        if n < 1:
            raise InvalidArgumentError(f"GradReduction.begin: n_targets {n} must be >= 1")
        self._state = _k.TokRed(self.params, self.seq_len, self.total_tokens)
        self._loss_state = _k.TokRed([()], self.seq_len, self.total_tokens)
        self.n_targets, self.loss, self.phase = n, None, "bound"
        self._gen += 1
        self._ranges, self._added = [], 0

    def agree(self, comm=None):
        """End pass 0: agree the grids (one small MAX all-reduce per state);
        pass 1 (add) follows."""
        self._require("bound", "agree")
        if not self._ranges:
            raise InvalidArgumentError("GradReduction.agree: pass 0 ran no micro-batch")
        fn, rank = _comm_of(comm)
        try:
            self._state.agree(fn, rank=rank)
            self._loss_state.agree(fn, rank=rank)
        except Error as e:
            self.phase = "failed"
            raise _renamed(e, self.names) from e
        self.phase = "add"
        self._gen += 1

    def finish(self, comm=None):
        """End pass 1: SUM all-reduce of the int64 words (with an agreement
        step), then every parameter's ``.grad`` = its gradient (replaced, not
        accumulated), and ``self.loss``. Nothing is written on error."""
        self._require("add", "finish")
        if self._added != len(self._ranges):
            raise InvalidArgumentError(
                f"GradReduction.finish: pass 1 ran {self._added} of pass 0's "
                f"{len(self._ranges)} micro-batches")
        fn, rank = _comm_of(comm)
        self.phase = "failed"  # until everything below succeeded
        try:
            self._state.allreduce(fn, rank=rank)
            self._loss_state.allreduce(fn, rank=rank)
            outs = [torch.empty(p.shape, dtype=_F32) for p in self.params]
            self._state.finish(outs, 1)
            loss = None
            if any(_k.words(self._loss_state)[2:]):  # any chunk of the loss added (globally)
                loss = torch.empty((), dtype=_F32)
                self._loss_state.finish([loss], self.n_targets)
        except Error as e:
            raise _renamed(e, self.names + ["loss"]) from e
        for p, g in zip(self.params, outs):
            p.grad = g
        self.loss, self.phase = loss, "done"
        self._gen += 1
        return loss

    def run_two_pass(self, closure, micro_batches, comm=None, n_targets=None):
        """One step: ``micro_batches`` a list of (first_token, num_tokens)
        (global token ids, whole sequences), ``closure(i)`` runs the forward
        and backward of micro-batch i; run for pass 0, agree, run again,
        finish. Returns the closure's pass-1 results."""
        self.begin(n_targets)
        for i, (b, n) in enumerate(micro_batches):
            with self.micro_batch(b, n):
                closure(i)
        self.agree(comm)
        out = []
        for i, (b, n) in enumerate(micro_batches):
            with self.micro_batch(b, n):
                out.append(closure(i))
        self.finish(comm)
        return out

    @_contextlib.contextmanager
    def micro_batch(self, first_token, num_tokens):
        """The bitexact modules called inside hold the micro-batch of global
        tokens [first_token, first_token + num_tokens) (whole sequences)."""
        if self.phase not in ("bound", "add"):
            raise InvalidArgumentError(f"GradReduction.micro_batch: no pass is running (phase "
                                       f"'{self.phase}'): begin() first")
        if _active() is not None:
            raise InvalidArgumentError("GradReduction.micro_batch: already inside a micro_batch")
        b, n = int(first_token), int(num_tokens)
        if n < 1:
            raise InvalidArgumentError(f"GradReduction.micro_batch: num_tokens {n} must be >= 1")
        c0, _ = self._state.chunks(b, b + n)  # LayoutError: not whole chunks
        if self.phase == "bound":
            self._ranges.append((b, n))
        else:
            if self._added >= len(self._ranges) or self._ranges[self._added] != (b, n):
                want = self._ranges[self._added] if self._added < len(self._ranges) else "none"
                raise InvalidArgumentError(
                    f"GradReduction.micro_batch: pass 1 must repeat pass 0's micro-batches in "
                    f"order; got tokens ({b}, {n}), expected {want}")
            self._added += 1
        self._mb = _MicroBatch(self, b, n, c0)
        _tls.red = self
        try:
            yield self._mb
        finally:
            _tls.red = None
            self._mb = None

    def count_targets(self, targets, ignore_index=-100, comm=None):
        """The global count of targets != ignore_index (int64, order-free):
        the local count (bx_xent_count) summed over ranks through comm."""
        t = _check("GradReduction.count_targets", "targets", targets, (torch.int32, torch.int64))
        counts = torch.empty(1, dtype=torch.int64)
        _k.xent_count(t.reshape(-1), t.numel() or 1, counts, ignore_index=ignore_index)
        buf = bytearray(counts.numpy().tobytes())
        fn, _ = _comm_of(comm)
        if fn is not None:
            r = fn(buf, "sum")
            if r is not None:
                buf = bytearray(r)
        return int.from_bytes(bytes(buf), "little", signed=True)

    def _require(self, phase, what):
        if self.phase != phase:
            raise InvalidArgumentError(f"GradReduction.{what}: called in phase '{self.phase}', "
                                       f"expected '{phase}' (begin, micro-batches, agree, the same "
                                       "micro-batches, finish)")


class _MicroBatch:
    """What a module's forward captures: the reduction, its generation (the
    pass), the micro-batch's tokens and first global chunk, and the
    parameters already used in it."""

    def __init__(self, red, first_token, num_tokens, first_chunk):
        self.red, self.gen = red, red._gen
        self.tok0, self.T, self.chunk0 = first_token, num_tokens, first_chunk
        self.used = set()
        self.loss_used = False

    def take(self, fn, param, name, rows, exact):
        """The state index of param, checked: rows of its input = the
        micro-batch's tokens (exact) or a multiple (rows per token),
        registered, used once."""
        red = self.red
        if (rows != self.T) if exact else (rows % self.T):
            raise _err(InvalidArgumentError, fn, "input", f"has {rows} token rows, the "
                       f"micro-batch holds {self.T} tokens{'' if exact else ' (or a multiple)'}")
        i = red._index.get(id(param))
        if i is None:
            raise _err(InvalidArgumentError, fn, name, "requires grad but is not a parameter of "
                       "the active GradReduction")
        if i in self.used:
            raise _err(InvalidArgumentError, fn, name, f"({red.names[i]}) is used twice in one "
                       "micro-batch: its chunk partials would be added twice (not supported)")
        self.used.add(i)
        return i

    def check(self, what):
        red = self.red
        if red._gen != self.gen:
            raise InvalidArgumentError(f"{what}: this backward belongs to a finished pass of the "
                                       f"GradReduction (now in phase '{red.phase}'): run the "
                                       "backward inside its own pass")
        return red.phase == "bound"


def _comm_of(comm):
    dist = torch.distributed
    if dist.is_available() and isinstance(comm, dist.ProcessGroup):
        from .torch import comm as _tcomm  # a torch.distributed ProcessGroup
        comm = _tcomm(comm)
    return _comm_args(comm)


def _capture(fn, weights, exact=True):
    """At forward: the micro-batch and the state indices of the weights
    that will need a gradient (None where none). No reduction active and a
    trainable weight with grad mode on: an error (gradients of bitexact
    modules go through a GradReduction)."""
    want = [(w, n) for w, n, rows in weights if torch.is_grad_enabled() and w.requires_grad]
    if not want:
        return None, [None] * len(weights)
    red = _active()
    if red is None:
        raise _err(InvalidArgumentError, fn, want[0][1], "requires grad, but no GradReduction "
                   "micro_batch is active (bitexact modules add weight gradients to it; "
                   "docs/torch_layers.md)")
    mb = red._mb
    idx = [mb.take(fn, w, n, rows, exact) if (torch.is_grad_enabled() and w.requires_grad) else None
           for w, n, rows in weights]
    return mb, idx


def _wgrad(mb, idx, dy, x, what):
    """A linear weight's gradient dY^T X over the micro-batch's rows, as
    chunk partials: bounded a priori (pass 0) or computed and added (pass 1)."""
    bound = mb.check(what)
    s, red = mb.red._state, mb.red
    f = _k.linear_wgrad_bound if bound else _k.linear_wgrad
    try:
        f(s, w_tensor=idx, b_tensor=None, dy=dy, x=x, token_begin=mb.tok0, num_threads=red.num_threads)
    except Error as e:
        raise _renamed(e, red.names) from e


def _partials(mb, idx, partials, what):
    """Per-chunk partials [nchunks, ...] of tensor idx: bound or add."""
    bound = mb.check(what)
    s = mb.red._state
    try:
        for j in range(partials.shape[0]):
            (s.bound if bound else s.add)(idx, mb.chunk0 + j, partials[j])
    except Error as e:
        raise _renamed(e, mb.red.names) from e


def _rows(t, last):
    return t.reshape(-1, last)
