"""bitexact.kernels — the training kernels of libbitexact (bitexact_train.h),
one Python function per C kernel, framework-neutral.

This is the low-level layer on which bitexact's autograd functions, modules
and optimizers are built; it records no autograd and allocates nothing.
Contract (docs/kernels_python.md has the per-function table):

* Arguments come in the C order (tensors and scalars as the C call takes
  them, positional or by keyword, the C parameter names); the fields of the
  C options struct are keyword-only arguments whose defaults are the C
  library's DEFAULT macros (num_threads=0: the library's default pool).
* Tensors are any DLPack producer: torch and numpy arrays, paddle tensors
  (through bitexact's exporter), JAX/CuPy-style objects, or a DLPack capsule.
  They are exported without a copy and released when the call returns.
* Outputs are the caller's tensors, written in place; a function returns
  None (the scalar helpers and TokRed methods return what they say). An
  output exported read-only (DLPack 1.0 flag, e.g. a non-writeable numpy
  array) or as a copy is refused before the call. Aliasing: an output may
  be an input only where the kernel's docstring says "may be ... itself";
  any other overlap is a LayoutError.
* Every check (dtype, shape, device, layout, overlap, values) is the C
  library's and runs before its first write: a failing call writes
  nothing. Errors are bitexact's exceptions (InvalidArgumentError,
  DTypeError, DeviceError, LayoutError, NonFiniteError, ...) with the text
  "fn: argument 'name': <bx_last_error()>" and the attributes `argument`
  (the name; absent when no single tensor is at fault) and `tensor` (its
  slot among the call's tensors).
* The GIL is released for the kernel; the kernels' own worker threads give
  the same bits for any num_threads. Calls on distinct outputs may run
  concurrently; a TokRed is used by one thread at a time.
* torch tensors: once bitexact knows torch is loaded (torch imported before
  this module, or bitexact.torch imported, or use_fast_frameworks() called)
  they are exported through torch's C exporter, which accepts tensors that
  require grad (the kernels read and write their memory; autograd is not
  told, and in-place writes do not bump the tensor's version counter).
  Before that they go through Tensor.__dlpack__, which refuses them: the
  error says to pass tensor.detach().

No numerics happen in Python or in the binding: every value is computed by
the C library, so the bits are those of `bitexact train`.
"""
import sys as _sys

from . import _core
from . import _frameworks

# The kernels, re-exported as they are (C functions: no Python frame).
from ._core import (  # noqa: F401
    GEMM_NN,
    GEMM_NT,
    GEMM_TN,
    TokRed,
    adamw_step,
    attention_backward,
    attention_forward,
    bias_grad_partials,
    cos,
    cos_f32,
    embedding_backward,
    embedding_forward,
    embedding_grad_add,
    embedding_grad_bound,
    exp,
    exp_f32,
    gemm,
    linear_wgrad,
    linear_wgrad_bound,
    log,
    log_f32,
    lr_at,
    moe_bias_update,
    moe_dispatch_order,
    moe_dispatch_plan,
    moe_expert_chunks,
    moe_permute,
    moe_permute_backward,
    moe_router_backward,
    moe_router_forward,
    moe_unpermute,
    moe_unpermute_backward,
    rmsnorm_backward,
    rmsnorm_forward,
    rope_backward,
    rope_cos_sin,
    rope_forward,
    rsqrt,
    rsqrt_f32,
    sigmoid,
    sigmoid_f32,
    silu,
    silu_f32,
    sin,
    sin_f32,
    swiglu_backward,
    swiglu_backward_fused,
    swiglu_forward,
    swiglu_forward_fused,
    wgrad_bound_exp,
    xent_backward,
    xent_count,
    xent_forward,
    xent_forward_backward,
)

__all__ = [n for n in dir(_core) if n in globals() and not n.startswith("_")
           and n not in ("Views",)] + ["use_fast_frameworks", "words"]


def use_fast_frameworks():
    """Register the C exporters of the frameworks already imported (torch:
    torch._C._to_dlpack; paddle: the DenseTensor export), as bitexact's
    other entry points do on their first call. Idempotent and cheap."""
    _frameworks.use_fast()


def words(state, like="numpy"):
    """The wire words of a TokRed (after agree, grid mode) as a writable
    int64 array sharing the state's memory: like="numpy" (numpy.ndarray) or
    "torch" (torch.Tensor on the CPU, for torch.distributed.all_reduce).
    A SUM all-reduce of these words over the ranks, written back in place,
    makes the state that of the whole global batch (bx_tokred_words)."""
    if like == "numpy":
        import numpy
        return numpy.frombuffer(state, dtype=numpy.int64)
    if like == "torch":
        import torch
        import warnings
        with warnings.catch_warnings():  # frombuffer warns that the buffer is writable
            warnings.simplefilter("ignore")
            return torch.frombuffer(state, dtype=torch.int64)
    raise _core.InvalidArgumentError(f"words: like must be 'numpy' or 'torch', not {like!r}")


use_fast_frameworks()
