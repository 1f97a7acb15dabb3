"""What the framework patches (bitexact.megatron, bitexact.deepspeed,
bitexact.torchtitan) share: the norm's words reduced over a framework's
own torch.distributed groups, and the context manager patch() returns.
No numerics here: the words are the library's (bitexact.Comm)."""
import inspect as _inspect

import torch
import torch.distributed as _dist

from .. import InvalidArgumentError


def all_reduce_words(words, op, group):
    """words (a CPU int64 tensor) all-reduced in place over group; through
    the current CUDA device for groups without a CPU backend (NCCL)."""
    backend = str(_dist.get_backend(group)).lower()
    if "gloo" in backend or "mpi" in backend or "cpu" in backend or "ccl" in backend:
        _dist.all_reduce(words, op=op, group=group)
        return
    moved = words.to(torch.device("cuda", torch.cuda.current_device()))
    _dist.all_reduce(moved, op=op, group=group)
    words.copy_(moved.cpu())


class ChainComm:
    """The allreduce of a bitexact.Comm over a framework's groups. The
    library calls it twice (DESIGN §5; bitexact.Comm): first a small MAX
    agreement step, reduced over every process group involved, then the
    norm's one reduction, whose buffer holds one block of equal size per
    bitexact group, in group order (bx_total_norm's wire). Block k is
    reduced over chains[k], a list of process groups, one after the other
    (integer sums compose: the sum over their product, as a framework's
    successive all_reduces of float partials). who: the caller's name in
    messages."""

    __slots__ = ("chains", "calls", "who")

    def __init__(self, chains, who):
        self.chains = chains
        self.calls = 0
        self.who = who

    def __call__(self, buf, op):
        words = torch.frombuffer(buf, dtype=torch.int64)
        reduce_op = _dist.ReduceOp.SUM if op == "sum" else _dist.ReduceOp.MAX
        first = self.calls == 0
        self.calls += 1
        if first:
            seen = []
            for chain in self.chains:
                for g in chain:
                    if not any(g is s for s in seen):
                        seen.append(g)
            for g in seen:
                all_reduce_words(words, reduce_op, g)
            return
        n = words.numel() // len(self.chains)
        if n * len(self.chains) != words.numel():
            raise InvalidArgumentError(
                f"{self.who}: a norm buffer of {words.numel()} words does not split into "
                f"{len(self.chains)} groups (library wire layout changed?)")
        for k, chain in enumerate(self.chains):
            for g in chain:
                all_reduce_words(words[k * n:(k + 1) * n], reduce_op, g)


class Patched:
    """What patch() returns: ``with bitexact.<framework>.patch(): ...``
    calls unpatch on exit."""

    __slots__ = ("_unpatch",)

    def __init__(self, unpatch):
        self._unpatch = unpatch

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._unpatch()
        return False


def check_signature(original, ours, who, supported):
    """Refuse to patch a framework function whose positional signature
    (names and defaults) is not the one ``ours`` implements (keyword-only
    extensions of ours aside): another release of the framework. who: the
    patch and the function ("bitexact.megatron: megatron-core's
    get_grad_norm_fp32"); supported: the release bitexact supports."""
    want = [(p.name, p.default) for p in _inspect.signature(original).parameters.values()]
    have = [(p.name, p.default) for p in _inspect.signature(ours).parameters.values()
            if p.kind is not p.KEYWORD_ONLY]
    if want != have:
        raise InvalidArgumentError(
            f"{who}{_inspect.signature(original)} is not the signature bitexact implements "
            f"({', '.join(n for n, _ in have)}); this bitexact supports {supported}")
