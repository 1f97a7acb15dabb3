"""bitexact.paddle.trace: the bitexact trace (docs/trace.md) of any
``paddle.nn.Layer``, in the format and with the semantics of
bitexact.torch.trace, so that a Paddle trace and a torch trace of the same
model compare entry by entry::

    with bitexact.paddle.trace(layer, "b.trace") as t:
        for batch in data:
            loss = layer(batch).sum(); loss.backward()
            opt.step()
            t.step()          # gradients and updated parameters, then the step's lines
            opt.clear_grad()

- outputs: a forward post-hook on every sublayer (``named_sublayers``, the
  root under its class name unless ``include_root=False``);
- input gradients, as torch's full backward hook gives them (the gradient
  with respect to a layer's positional inputs from **this layer's use
  only**, not the total of a tensor that also feeds a residual): a forward
  pre-hook replaces each floating-point positional input that requires a
  gradient (``stop_gradient`` False) by an exact identity copy
  (``Tensor.clone()``: the same bits) used by this layer alone, and
  registers a gradient hook on that copy that records ``grad_input.k`` (k:
  the position of the argument);
- parameters (``named_parameters()``): the weight of every
  ``paddle.nn.Linear`` (and subclass), which Paddle stores ``[in, out]``,
  is recorded in torch layout ``[out, in]`` (its value and its gradient
  transposed), as is its shape in the default model id, so that a Paddle
  trace compares with a torch trace of the same model; every other
  parameter (bitexact.paddle's own layers already keep torch layout) is
  recorded as stored.

The keyword arguments (``seq_len``, ``include_root``, ``model``,
``producer``, ``dump``), ``grads()``, ``discard()`` and ``step()`` are those
of bitexact.torch.trace (the shared logic is bitexact._trace.TracerCore).
"""
import paddle

from .. import _trace


def _is_tensor(t):
    return isinstance(t, paddle.Tensor)


def _float_array(t):
    """(numpy array, dtype name or None) of a floating-point tensor (bf16
    as its uint16 bit patterns: Paddle's numpy() of a bf16 tensor), else
    None."""
    if not _is_tensor(t) or not t.is_floating_point():
        return None
    if t.dtype == paddle.bfloat16:
        return t.detach().cpu().numpy(), "BF16"
    return t.detach().cpu().numpy(), None


class Tracer(_trace.TracerCore):
    def __init__(self, layer, path, batch_dim=0, *, seq_len=None, include_root=True, model=None,
                 producer=None, dump=None):
        self.layer = layer
        root = type(layer).__name__
        self._transposed = {id(l.weight) for _, l in layer.named_sublayers(include_self=True)
                            if isinstance(l, paddle.nn.Linear) and l.weight is not None}
        if model is None:
            model = _trace.model_id(root, ((n, self._torch_shape(p)) for n, p in layer.named_parameters()))
        super().__init__(path, model, producer or f"bitexact.paddle {paddle.__version__}",
                         batch_dim, seq_len, dump)
        self._hooks = [layer.register_forward_pre_hook(self._pre, with_kwargs=True)]
        for name, l in layer.named_sublayers(include_self=True):
            if l is layer and not include_root:
                continue
            self._hooks.append(l.register_forward_pre_hook(self._copy_inputs(name or root)))
            self._hooks.append(l.register_forward_post_hook(self._fwd(name or root)))

    _float_array = staticmethod(_float_array)

    def _torch_shape(self, p):
        s = tuple(p.shape)
        return s[::-1] if id(p) in self._transposed else s

    def _pre(self, layer, args, kwargs):
        first = next((a for a in list(args) + list(kwargs.values()) if _is_tensor(a)), None)
        self.set_batch(None if first is None else tuple(first.shape))

    def _copy_inputs(self, name):
        def hook(layer, inputs):
            if not paddle.is_grad_enabled():
                return None
            out, changed = list(inputs), False
            for k, x in enumerate(inputs):
                if _is_tensor(x) and x.is_floating_point() and not x.stop_gradient:
                    c = x.clone()  # the same bits; its gradient is this layer's use alone
                    c.register_hook(self._bwd(name, k))
                    out[k], changed = c, True
            return tuple(out) if changed else None
        return hook

    def _bwd(self, name, k):
        def hook(g):
            self.activation("backward", name, f"grad_input.{k}", g)
            return None
        return hook

    def _fwd(self, name):
        def hook(layer, inputs, out):
            for what, o in _trace.flatten_outputs(out, _is_tensor):
                self.activation("forward", name, what, o)
            return None
        return hook

    def _parameters(self, grads):
        for n, p in self.layer.named_parameters():
            t = p.grad if grads else p
            v = _float_array(t) if t is not None else None
            if v is not None and id(p) in self._transposed:
                v = (v[0].T, v[1])
            if grads:
                yield n, None, None, v[0] if v else None, v[1] if v else None
            elif v is not None:
                yield n, v[0], v[1], None, None


def trace(layer, path, batch_dim=0, *, seq_len=None, include_root=True, model=None, producer=None,
          dump=None):
    """Trace `layer` into `path` for the duration of the block (yields the
    :class:`Tracer`; call its ``step()`` once per training step)."""
    return _trace.traced(Tracer(layer, path, batch_dim, seq_len=seq_len, include_root=include_root,
                                model=model, producer=producer, dump=dump))
