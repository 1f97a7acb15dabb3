"""bitexact.torch.trace: the bitexact trace (docs/trace.md) of any
``nn.Module``, through forward hooks (every submodule's output), full
backward hooks (every submodule's input gradients) and, at
:meth:`Tracer.step`, every parameter's gradient and value::

    with bitexact.torch.trace(model, "a.trace") as t:
        for batch in data:
            loss = model(batch).sum(); loss.backward()
            opt.step()
            t.step()          # gradients and updated parameters, then the step's lines
            opt.zero_grad()

Activations are cut along ``batch_dim`` (default 0) into one entry per
sequence, numbered ``t.seq_offset + i`` (set ``t.seq_offset`` before each
micro-batch to its first global sequence, so that two micro-batchings of
one batch write the same entries); a tensor whose size along ``batch_dim``
is not the batch size of the traced module's first input is traced whole
(``"slice": null``). Then ``bitexact diff --trace a.trace b.trace`` names
the first difference.
"""
import contextlib

import numpy as np
import torch

from .. import _trace


def _model_id(module):
    import xxhash
    h = xxhash.xxh3_64()
    h.update(type(module).__name__.encode())
    for n, p in module.named_parameters():
        h.update(f"{n}:{tuple(p.shape)};".encode())
    return f"torch:{type(module).__name__}:{h.hexdigest()}"


def _arrays(t):
    """(array, dtype name or None, float64 values or None) of a tensor."""
    t = t.detach()
    if t.dtype == torch.bfloat16:
        c = t.cpu().contiguous()
        return c.view(torch.int16).numpy().view(np.uint16), "BF16", c.double().numpy()
    return t.cpu().contiguous().numpy(), None, None


class Tracer:
    def __init__(self, module, path, batch_dim=0):
        self.module, self.batch_dim, self.seq_offset = module, batch_dim, 0
        self.w = _trace.TraceWriter(path, _model_id(module), f"bitexact.torch {torch.__version__}")
        self._batch = None
        self._hooks = []
        for name, m in module.named_modules():
            self._hooks.append(m.register_forward_hook(self._fwd(name or type(module).__name__)))
            self._hooks.append(m.register_full_backward_hook(self._bwd(name or type(module).__name__)))
        self._hooks.append(module.register_forward_pre_hook(self._pre))

    def _pre(self, m, args):
        first = next((a for a in args if isinstance(a, torch.Tensor)), None)
        self._batch = first.shape[self.batch_dim] if first is not None and first.dim() > self.batch_dim else None

    def _add(self, phase, name, what, t):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            return
        d = self.batch_dim
        if self._batch is not None and t.dim() > d and t.shape[d] == self._batch:
            for i in range(t.shape[d]):
                a, dt, vals = _arrays(t.select(d, i))
                self.w.add(phase, name, what, self.seq_offset + i, a, dt, vals)
        else:
            a, dt, vals = _arrays(t)
            self.w.add(phase, name, what, None, a, dt, vals)

    def _fwd(self, name):
        def hook(m, args, out):
            outs = out if isinstance(out, (tuple, list)) else (out,)
            for k, o in enumerate(outs):
                self._add("forward", name, "output" if len(outs) == 1 else f"output.{k}", o)
        return hook

    def _bwd(self, name):
        def hook(m, grad_input, grad_output):
            for k, g in enumerate(grad_input):
                self._add("backward", name, f"grad_input.{k}", g)
        return hook

    def step(self):
        """The parameters' gradients (backward phase) and values (optimizer
        phase), then this step's lines; call it after optimizer.step()."""
        for n, p in self.module.named_parameters():
            if p.grad is not None:
                a, dt, vals = _arrays(p.grad)
                self.w.add("backward", n, "grad", None, a, dt, vals)
        for n, p in self.module.named_parameters():
            a, dt, vals = _arrays(p)
            self.w.add("optimizer", n, "param", None, a, dt, vals)
        self.w.end_step()

    def close(self):
        for h in self._hooks:
            h.remove()
        self._hooks = []
        self.w.close()


@contextlib.contextmanager
def trace(module, path, batch_dim=0):
    """Trace `module` into `path` for the duration of the block (yields the
    :class:`Tracer`; call its ``step()`` once per training step)."""
    t = Tracer(module, path, batch_dim)
    try:
        yield t
    finally:
        t.close()
