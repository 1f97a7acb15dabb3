"""bitexact.torch's GradReduction: the weight gradients of a training step
as layout-invariant token reductions, for the layers of torch/_layers.py
(docs/torch_layers.md).

Every forward and backward value is computed by a bitexact kernel (torch
only allocates and reshapes); the bits are those of `bitexact train`'s
kernels. Weight gradients never go through torch's accumulation into
``.grad``: each module adds its per-chunk partials (one chunk = one
sequence of ``seq_len`` tokens) to the :class:`GradReduction` of the step,
which owns one ``bitexact.kernels.TokRed`` over the parameters and writes
every ``.grad`` at :meth:`GradReduction.finish`. A step
(:meth:`GradReduction.run_step`) is one forward + backward on a grid stated
from the previous steps' observed exponents (:attr:`history`), run again on
its observed grid when an add breaks it (or there is no history); or two
passes (:meth:`run_two_pass`: pass 0 bounds, the grid is agreed, pass 1
adds). Either way gradients and the loss are bitwise the same for any
micro-batching, thread count and data-parallel rank count.

Threading: a GradReduction is used by one thread at a time (the one running
the step); the kernels release the GIL and their own worker threads
(``num_threads``) never change a bit. Its users: torch/_layers.py and
torch/_moe.py, torch/_glm.py. Not covered: CUDA tensors.
"""
import threading

import torch

from .. import DeviceError, DTypeError, InvalidArgumentError, LayoutError
from ..nn import _gradred as _g
from ..nn._gradred import _active, _err, _renamed, _threads  # noqa: F401 (used by torch._layers)

__all__ = ["GradReduction"]

_F32 = torch.float32


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


# ---- the step's gradient reduction ---------------------------------------

class GradReduction(_g.GradReductionBase):
    """The gradients of one training step as layout-invariant token
    reductions (``bitexact_train.h`` "Token reduction"); the protocol is
    bitexact.nn._gradred's (shared with bitexact.paddle.GradReduction).

    ``GradReduction(parameters, seq_len, total_tokens, *, num_threads=0,
    compute_dtype="fp32")``:
    ``parameters`` the trained fp32 CPU parameters (Parameters or
    ``named_parameters()`` pairs, names used in messages), each used by
    exactly one bitexact module call per micro-batch; ``seq_len`` = the
    chunk: a micro-batch holds whole sequences; ``total_tokens`` the global
    batch's tokens (all micro-batches of all ranks). ``num_threads`` bounds
    the kernels' worker threads (bits never depend on it).
    ``compute_dtype="bf16"``: the modules' GEMMs (all but the MoE router's)
    take bf16-rounded operands with fp32 accumulation, the weight
    gradients' TN partials too (`bitexact train --compute-dtype bf16`);
    weights, gradients and everything else stay fp32.

    A step, on every rank: ``red.run_step(closure, micro_batches, comm)``
    (``closure(i)`` runs micro-batch i's forward + backward; one pass while
    the grid stated from :attr:`history` holds, ``red.passes`` says how many
    ran; the history is checkpointed as ``red.history``, a dict name ->
    exponent plus ``"loss"``; docs/train_model.md, "The one-pass invariant
    step"). The two-pass protocol, per step (:meth:`run_two_pass` does it)::

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

    def _fw_check_param(self, name, p):
        _check("GradReduction", name, p, min_ndim=0)
        if not p.is_contiguous():
            raise _err(LayoutError, "GradReduction", name, "must be contiguous")
        if not p.requires_grad:
            raise _err(InvalidArgumentError, "GradReduction", name, "does not require grad")

    def _fw_empty_f32(self, shape):
        return torch.empty(shape, dtype=_F32)

    def _fw_set_grad(self, p, g):
        p.grad = g

    def _fw_comm(self, comm):
        dist = torch.distributed
        if dist.is_available() and isinstance(comm, dist.ProcessGroup):
            from . import comm as _tcomm  # a torch.distributed ProcessGroup
            comm = _tcomm(comm)
        return super()._fw_comm(comm)

    def _fw_targets(self, fn, targets):
        return _check(fn, "targets", targets, (torch.int32, torch.int64)).reshape(-1)

    def _fw_empty_i64(self, n):
        return torch.empty(n, dtype=torch.int64)

    def _fw_bytes(self, t):
        return t.numpy().tobytes()


_tls = threading.local()  # .rec: the compiled call being run (_torch_compile._Recording), or None


def _capture(fn, weights, exact=True):
    """At forward: the micro-batch and the state indices of the weights
    that will need a gradient (grad mode on and requires_grad; inside a
    torch.compile'd call, _torch_compile's flags decided at trace time)."""
    rec = getattr(_tls, "rec", None)
    if rec is not None:
        trainable = lambda w: rec.flags.get(id(w), False)  # noqa: E731
    else:
        grad = torch.is_grad_enabled()
        trainable = lambda w: grad and w.requires_grad  # noqa: E731
    return _g.capture(fn, weights, trainable, "docs/torch_layers.md", exact)


def _rows(t, last):
    return t.reshape(-1, last)
