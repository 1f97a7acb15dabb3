"""Exact drop-in for torchtitan's gradient clipping.

    import bitexact.torchtitan
    bitexact.torchtitan.patch()

switches a torchtitan run (torchtitan 0.3.0 from PyPI, pinned in
scripts/clients_setup.sh) to bitexact: ``Trainer.train_step`` (and every
other torchtitan trainer) calls ``torchtitan.distributed.utils.
clip_grad_norm_``, which patch() replaces by :func:`clip_grad_norm_`
below; any loaded ``torchtitan*`` module that imported the function by
name gets it too. ``unpatch()`` restores torchtitan's own. The function
can also be called directly, with torchtitan's signature:

    clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False,
                    foreach=None, pp_mesh=None, ep_enabled=False)

plus keyword-only ``num_threads=``, ``flavor=`` and ``scale_mode=``.

What is computed. The exact p-norm of every gradient element of the whole
model, the same bits on every rank, whatever the FSDP/HSDP/TP/EP/PP
layout: :func:`bitexact.torch.clip_grad_norm_` with ``process_group=`` the
world group. Each rank counts the local shard of its DTensor gradients; a
``Replicate`` mesh dimension (HSDP replicas, tensor-parallel duplicates
such as norm weights) is counted by the rank with coordinate 0 on it; the
integer accumulator words of all ranks are summed with one int64
``all_reduce(SUM)`` over the world and rounded once. So each element is
counted exactly once when every gradient's device mesh covers its whole
pipeline stage, which is how torchtitan builds its meshes (dense
parameters on the ``dp_replicate``/``fsdp``/``tp`` axes, expert parameters
on ``dp_replicate``/``efsdp``/``ep``, every axis but ``pp``):

- ``pp_mesh`` given (pipeline parallelism): each gradient mesh must have
  ``world / pp_mesh.size()`` ranks and meet the pipeline line through this
  rank only at this rank (one stage); the world group then spans every
  stage. Plain-tensor gradients are accepted only when a stage is one rank.
- ``pp_mesh`` None: each gradient mesh must span the world (plain tensors:
  a world of one rank).

Anything else raises :class:`bitexact.InvalidArgumentError`, naming the
parameter and the mesh, on every rank and before any collective: a mesh
smaller than its stage (its copies outside the mesh would be counted
again), plain-tensor gradients on a stage of several ranks, a pipeline
used without ``pp_mesh``. Never a per-stage or double-counted norm
(torchtitan's own function returns the stage's norm when ``pp_mesh`` is
left out).

``ep_enabled`` is accepted: expert and dense gradients go into the one
exact sum (their meshes differ; ownership is decided per gradient).
torchtitan rounds two norms and combines them as ``(a**p + b**p)**(1/p)``.

Clipping is torchtitan's, i.e. torch's ``clip_grads_with_norm_``: every
gradient, counted or not, is multiplied by ``clamp(max_norm / (total +
1e-6), max=1)``, computed with torch's tensor ops and applied with torch's
arithmetic (``scale_mode="torch"``). For the same norm the clipped
gradients are bitwise torchtitan's. The result is what torchtitan
returns: a plain 0-dim tensor (not a DTensor) of the dtype torch's
``get_total_norm`` gives (fp32 for fp32 gradients), the same bits on every
rank; the trainer's ``grad_norm.item()`` logs the exact norm.

Differences from torchtitan, on purpose:

- the norm is exact; torchtitan's is a float reduction, a few ulp off and
  dependent on the layout, and its clipped gradients differ whenever its
  norm does;
- the layout checks above;
- ``foreach`` is ignored; a negative or NaN ``max_norm`` raises;
- the norm dtype is agreed over the ranks (torch's promotion of every
  rank's gradient dtypes).

Everything else (``norm_type`` inf/1/0/p, ``error_if_nonfinite``, a NaN
norm scaling every gradient to NaN) follows :mod:`bitexact.torch`.

Threading: called from the training thread, the same collectives in the
same order on every rank, as torchtitan's; no state between calls.
"""
import sys as _sys

import torch
import torch.distributed as _dist

from . import InvalidArgumentError, _option, _FLAVORS
from . import torch as _bt
from .torch._groups import Patched
from .torch._groups import check_signature as _check_signature

try:
    from torch.distributed.tensor import DTensor as _DTensor
except ImportError:  # torch without distributed
    _DTensor = None

__all__ = ["clip_grad_norm_", "patch", "unpatch", "is_patched"]


def _mesh_ranks(mesh):
    return mesh.mesh.flatten().tolist()


def _reduction(params, grads, pp_mesh):
    """(process_group, owned) for bitexact.torch.clip_grad_norm_: the world
    group, after checking that it counts every element once (module doc).
    Without torch.distributed: (None, None), this process alone."""
    if not (_dist.is_available() and _dist.is_initialized()):
        if pp_mesh is not None:
            raise InvalidArgumentError(
                "bitexact.torchtitan.clip_grad_norm_: pp_mesh given but torch.distributed "
                "is not initialised")
        return None, None
    world = _dist.get_world_size()
    me = _dist.get_rank()
    pp = 1
    line = None
    if pp_mesh is not None:
        if pp_mesh.ndim != 1:
            raise InvalidArgumentError(
                f"bitexact.torchtitan.clip_grad_norm_: pp_mesh has {pp_mesh.ndim} dimensions "
                "(torchtitan passes the 1-D 'pp' mesh)")
        line = set(_mesh_ranks(pp_mesh))
        pp = len(line)
        if me not in line or world % pp != 0:
            raise InvalidArgumentError(
                f"bitexact.torchtitan.clip_grad_norm_: pp_mesh {sorted(line)} does not hold "
                f"rank {me} or does not divide the world of {world} ranks into stages")
    stage = world // pp
    checked = {}
    plain = None
    for k, (p, g) in enumerate(zip(params, grads)):
        if _DTensor is not None and isinstance(g, _DTensor):
            mesh = g.device_mesh
            if id(mesh) in checked:
                continue
            ranks = _mesh_ranks(mesh)
            checked[id(mesh)] = mesh
            if len(ranks) != stage or (line is not None and set(ranks) & line != {me}):
                where = (f"one pipeline stage ({stage} of {world} ranks, pp_mesh "
                         f"{sorted(line)})" if line is not None else f"the world ({world} ranks)")
                hint = ("" if line is not None or len(ranks) >= world else
                        "; with pipeline parallelism pass pp_mesh= (torchtitan's pp mesh) so "
                        "that the norm covers every stage")
                raise InvalidArgumentError(
                    f"bitexact.torchtitan.clip_grad_norm_: parameters[{k}]'s gradient is a "
                    f"DTensor on a device mesh over ranks {ranks} "
                    f"(dims {mesh.mesh_dim_names}), which is not {where}: its copies outside "
                    f"the mesh cannot be counted exactly once{hint}")
        elif plain is None:
            plain = k
    if plain is not None and stage != 1:
        hint = ("" if line is not None else
                "; with pipeline parallelism pass pp_mesh= (torchtitan's pp mesh)")
        raise InvalidArgumentError(
            f"bitexact.torchtitan.clip_grad_norm_: parameters[{plain}]'s gradient is a plain "
            f"tensor while a {'stage' if line is not None else 'world'} has {stage} ranks: "
            "bitexact cannot tell whether the other ranks hold copies of it; use "
            f"bitexact.torch.clip_grad_norm_ with owned= and process_group={hint}")
    return _dist.group.WORLD, (True if plain is not None else None)


@torch.no_grad()
def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False, foreach=None,
                    pp_mesh=None, ep_enabled=False, *, num_threads=0, flavor="exact",
                    scale_mode="torch"):
    """torchtitan.distributed.utils.clip_grad_norm_, exact over every rank of
    every pipeline stage. Returns the total norm as a plain 0-dim tensor,
    the same bits on every rank. See the module docstring."""
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    else:
        parameters = list(parameters)
    params = [p for p in parameters if p.grad is not None]
    group, owned = _reduction(params, [p.grad for p in params], pp_mesh)
    total = _bt.clip_grad_norm_(params, max_norm, norm_type, error_if_nonfinite,
                                process_group=group, owned=owned, scale_mode=scale_mode,
                                num_threads=num_threads, flavor=flavor)
    if _DTensor is not None and isinstance(total, _DTensor):
        total = total.to_local()  # Replicate: every rank holds the norm
    return total


# ---- patch(): switch a torchtitan run --------------------------------------

_state = {"patched": None}  # while patched: {"records", "original", "ours"}


def _torchtitan_modules():
    return [m for name, m in list(_sys.modules.items())
            if m is not None and (name == "torchtitan" or name.startswith("torchtitan."))]


def patch(*, num_threads=0, flavor="exact"):
    """Switch torchtitan to bitexact: replace ``clip_grad_norm_`` in
    torchtitan.distributed.utils (what Trainer.train_step calls, as
    ``dist_utils.clip_grad_norm_``) and in any loaded ``torchtitan*``
    module that imported it by name; modules imported later see utils'
    patched attribute. ``num_threads`` and ``flavor`` apply to every call.
    Calling patch() again re-patches with the new options. Returns a
    context manager that unpatches on exit. Raises InvalidArgumentError
    (nothing patched) if torchtitan's signature differs from 0.3.0's."""
    _option(_FLAVORS, flavor, "flavor")
    import torchtitan.distributed.utils as tt_utils
    if _state["patched"] is not None:
        unpatch()
    original = tt_utils.clip_grad_norm_
    nt = int(num_threads)

    def clip_grad_norm_patched(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False,
                               foreach=None, pp_mesh=None, ep_enabled=False):
        return clip_grad_norm_(parameters, max_norm, norm_type, error_if_nonfinite, foreach,
                               pp_mesh, ep_enabled, num_threads=nt, flavor=flavor)

    _check_signature(original, clip_grad_norm_patched,
                     "bitexact.torchtitan: torchtitan's clip_grad_norm_", "torchtitan 0.3.0's")
    clip_grad_norm_patched.__name__ = clip_grad_norm_patched.__qualname__ = "clip_grad_norm_"
    clip_grad_norm_patched.__doc__ = (
        f"bitexact.torchtitan's clip_grad_norm_ (flavor={flavor!r}), see bitexact.torchtitan.")
    clip_grad_norm_patched.__wrapped__ = original
    records = [(mod, "clip_grad_norm_") for mod in _torchtitan_modules()
               if getattr(mod, "clip_grad_norm_", None) is original]
    for mod, name in records:
        setattr(mod, name, clip_grad_norm_patched)
    _state["patched"] = {"records": records, "original": original,
                         "ours": clip_grad_norm_patched, "flavor": flavor}
    return Patched(unpatch)


def unpatch():
    """Restore torchtitan's own clip_grad_norm_ (everywhere patch() put
    bitexact's, and in any torchtitan* module that imported the patched
    function since). No-op when not patched."""
    st = _state["patched"]
    if st is None:
        return
    for mod in _torchtitan_modules():
        if getattr(mod, "clip_grad_norm_", None) is st["ours"]:
            setattr(mod, "clip_grad_norm_", st["original"])
    _state["patched"] = None


def is_patched():
    """The flavour patch() installed, or None when torchtitan's own is in use."""
    st = _state["patched"]
    return st["flavor"] if st is not None else None

