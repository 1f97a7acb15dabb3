"""bitexact.torch's stream-ordered CUDA scaling: the gradients multiplied
by torch's clamped coefficient on torch's current stream, bitwise as
torch's CUDA ``_foreach_mul_`` (docs/python.md "CUDA tensors"). Split
from torch.py; nothing here synchronises the host."""
import torch

from ._ops import _BF16, _BIT, _F16, _F32, _F64


def _cuda_scale(views, coef, mode, nplan, device):
    """Enqueue tensors *= coef on the current stream, bitwise as torch's
    CUDA ``_foreach_mul_(grads, coef)``: each dtype's tensors by coef
    converted to that dtype (torch's kernels load the 0-dim coefficient as
    the tensors' dtype; fp32 and fp64 share one fp64 value, from which the
    library's torch mode takes fp32 for fp32 tensors). mode 1 ("exact"):
    every tensor by coef itself, the exact product rounded once. nplan: the
    norm plan, used when it holds every tensor and one coefficient serves
    them all."""
    # every check before the first enqueue (all-or-nothing): read-only or
    # copied exports, and tensors sharing memory (LayoutError naming both:
    # the per-dtype plans below each see only their own tensors)
    views.check_scale_targets()
    stream = torch.cuda.current_stream(device).cuda_stream
    coef = coef.to(device)
    present = views.dtypes & (_F16 | _BF16 | _F32 | _F64)
    # scale_mode "exact" (1): one coefficient, the exact product rounded once
    main = present if mode == 1 else (_F32 | _F64 | _BIT.get(coef.dtype, 0)) & present
    classes = [(main, coef)] if main else []
    for bit, dt in ((_BF16, torch.bfloat16), (_F16, torch.float16)):
        if present & bit and not main & bit:
            classes.append((bit, coef.to(dt)))
    with torch.no_grad():
        if nplan is not None and len(classes) == 1 and classes[0][0] == present:
            c64 = classes[0][1].to(torch.float64)  # exact widening
            nplan.scale_async(c64.data_ptr(), 0, stream)
            return
        for bits, c in classes:
            c64 = c.to(torch.float64)
            views.cuda_plan(-1, bits, stream, 2.0, False, 0, mode).scale_async(
                c64.data_ptr(), 0, stream)
