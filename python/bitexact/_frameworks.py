"""What the framework-neutral API needs to know of torch and Paddle (the
one place outside bitexact.torch / bitexact.paddle that does): their fast
DLPack exporters, registered with the extension (_core.register_exporter)
once the framework is imported (by :func:`use_fast`, which every entry
point calls, cheap once registered; or by bitexact.torch / bitexact.paddle
at import), and :func:`join_legacy_stream` before a blocking CUDA call."""
import sys as _sys

from . import _core

_torch_fast = False  # registered


def torch_fast_export():
    """Once torch is imported: export plain torch tensors through torch's C
    function (what Tensor.__dlpack__ calls after ~2 us of Python checks)."""
    global _torch_fast
    _torch_fast = True
    torch = _sys.modules["torch"]
    fn = getattr(getattr(torch, "_C", None), "_to_dlpack", None)
    if fn is not None:
        _core.register_exporter(torch.Tensor, fn)
        _core.register_exporter(torch.nn.Parameter, fn)


_paddle_fast = False


def paddle_export(t):
    return t.get_tensor()._to_dlpack_versioned()


def paddle_fast_export():
    """Once paddle is imported: export Paddle tensors through their
    DenseTensor's DLPack export (the same memory, no copy). Tensor.__dlpack__
    refuses tensors with stop_gradient=False, which every parameter and
    gradient is; the DenseTensor's export does not ask."""
    global _paddle_fast
    paddle = _sys.modules["paddle"]
    tensor = getattr(paddle, "Tensor", None)
    param = getattr(getattr(getattr(paddle, "base", None), "framework", None), "EagerParamBase",
                    None)
    if tensor is None or not hasattr(tensor, "get_tensor"):
        return  # paddle is still being imported
    _paddle_fast = True
    _core.register_exporter(tensor, paddle_export)
    if isinstance(param, type):
        _core.register_exporter(param, paddle_export)


def use_fast():
    """Register the exporters of the frameworks imported so far."""
    if not _torch_fast and "torch" in _sys.modules:
        torch_fast_export()
    if not _paddle_fast and "paddle" in _sys.modules:
        paddle_fast_export()


def join_legacy_stream(views):
    """Before a blocking call on CUDA tensors (run on the legacy default
    stream): make that stream wait for torch's current stream, as
    Tensor.__dlpack__(stream=1) would. torch tensors are exported through
    torch's C function, which does not; other producers were asked for no
    stream, which per DLPack means the legacy default stream."""
    kind, dev = views.device
    if kind != "cuda":
        return
    views.check_device()  # a clear error first, naming the tensor
    torch = _sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return  # torch has queued no CUDA work
    cur = torch.cuda.current_stream(dev)
    if cur.cuda_stream != 0:
        torch.cuda.default_stream(dev).wait_stream(cur)
