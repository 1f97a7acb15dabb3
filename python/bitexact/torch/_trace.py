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
one batch write the same entries); with ``seq_len`` a tensor of ``B *
seq_len`` rows (token-major ``[B*L, H]``) is cut into B entries of
``seq_len`` rows; a tensor of any other size along ``batch_dim`` is traced
whole (``"slice": null``). The keyword arguments (``seq_len``,
``include_root``, ``model``, ``producer``, ``dump``) and ``grads()``,
``discard()`` are documented in docs/trace.md; the shared logic is
bitexact._trace.TracerCore. Then ``bitexact diff --trace a.trace b.trace``
names the first difference.
"""
import numpy as np
import torch

from .. import _trace


def _float_array(t):
    """(numpy array, dtype name or None) of a floating-point tensor (bf16
    as its uint16 bit patterns), else None."""
    if not isinstance(t, torch.Tensor) or not t.is_floating_point():
        return None
    t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.cpu().contiguous().view(torch.int16).numpy().view(np.uint16), "BF16"
    return t.cpu().contiguous().numpy(), None


class Tracer(_trace.TracerCore):
    def __init__(self, module, path, batch_dim=0, *, seq_len=None, include_root=True, model=None,
                 producer=None, dump=None):
        self.module = module
        root = type(module).__name__
        if model is None:
            model = _trace.model_id(root, ((n, tuple(p.shape)) for n, p in module.named_parameters()))
        super().__init__(path, model, producer or f"bitexact.torch {torch.__version__}",
                         batch_dim, seq_len, dump)
        self._hooks = []
        for name, m in module.named_modules():
            if m is module and not include_root:
                continue
            self._hooks.append(m.register_forward_hook(self._fwd(name or root)))
            self._hooks.append(m.register_full_backward_hook(self._bwd(name or root)))
        self._hooks.append(module.register_forward_pre_hook(self._pre, with_kwargs=True))

    _float_array = staticmethod(_float_array)

    def _pre(self, m, args, kwargs):
        first = next((a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)), None)
        self.set_batch(None if first is None else tuple(first.shape))

    def _fwd(self, name):
        def hook(m, args, out):
            for what, o in _trace.flatten_outputs(out, lambda x: isinstance(x, torch.Tensor)):
                self.activation("forward", name, what, o)
        return hook

    def _bwd(self, name):
        def hook(m, grad_input, grad_output):
            for k, g in enumerate(grad_input):
                self.activation("backward", name, f"grad_input.{k}", g)
        return hook

    def _parameters(self, grads):
        for n, p in self.module.named_parameters():
            if grads:
                g = _float_array(p.grad) if p.grad is not None else None
                yield n, None, None, g[0] if g else None, g[1] if g else None
            else:
                v = _float_array(p)
                if v is not None:
                    yield n, v[0], v[1], None, None


def trace(module, path, batch_dim=0, *, seq_len=None, include_root=True, model=None, producer=None,
          dump=None):
    """Trace `module` into `path` for the duration of the block (yields the
    :class:`Tracer`; call its ``step()`` once per training step)."""
    return _trace.traced(Tracer(module, path, batch_dim, seq_len=seq_len, include_root=include_root,
                                model=model, producer=producer, dump=dump))
