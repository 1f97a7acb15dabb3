"""Shared test data and comparisons (imported by the tests and the
distributed workers)."""
import torch

DTYPES = {
    "float64": torch.float64,
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
INT_VIEW = {torch.float64: torch.int64, torch.float32: torch.int32,
            torch.bfloat16: torch.int16, torch.float16: torch.int16}
FMT = {v: k for k, v in DTYPES.items()}


def bits(t):
    """The bit patterns of a tensor, for bitwise comparison."""
    t = t.detach().contiguous()
    return t.view(INT_VIEW[t.dtype])


def same_bits(a, b):
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.is_sparse or b.is_sparse:
        a, b = a.to_dense(), b.to_dense()
    if a.dtype not in INT_VIEW:  # integer, bool, complex: == is bitwise enough here
        return torch.equal(a, b)
    return torch.equal(bits(a), bits(b))


def random_tensors(seed, dtypes, count=12, max_numel=3000, spread=12):
    """Gradients with a wide dynamic range: each tensor randn scaled by
    2^U(-spread, spread), per-element jitter of the exponent, some zeros;
    dtypes cycle through the given names."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for k in range(count):
        dt = DTYPES[dtypes[k % len(dtypes)]]
        ndim = int(torch.randint(1, 4, (1,), generator=g))
        numel_target = int(torch.randint(1, max_numel, (1,), generator=g))
        shape = [max(1, round(numel_target ** (1.0 / ndim)))] * ndim
        base = torch.randn(shape, generator=g, dtype=torch.float64)
        base *= 2.0 ** float(torch.empty(1).uniform_(-spread, spread, generator=g))
        base *= 2.0 ** torch.randint(-3, 4, shape, generator=g).double()
        base[torch.rand(shape, generator=g) < 0.05] = 0.0
        if dt == torch.float16:  # keep inside fp16's range
            base = base.clamp(-6e4, 6e4) * 1e-2
        out.append(base.to(dt))
    return out


def params_with_grads(grads):
    params = []
    for gr in grads:
        p = torch.nn.Parameter(torch.zeros_like(gr))
        p.grad = gr.clone()
        params.append(p)
    return params


def free_port():
    """A free TCP port on the loopback for a test's process group."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_ranks(main, ws):
    """Run main(rank, ws, port, out_dir) on ws spawned processes (a worker
    that saves its results with torch.save to <out_dir>/rank<r>.pt) and
    return every rank's results, in rank order."""
    import os
    import tempfile

    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(main, args=(ws, free_port(), d), nprocs=ws, join=True)
        return [torch.load(os.path.join(d, f"rank{r}.pt"), weights_only=False)
                for r in range(ws)]


def rank_results(ranks, key):
    """Every rank's result of one scenario (key), failing the test with the
    traceback of a rank whose scenario raised."""
    out = [r[key] for r in ranks]
    for r, o in enumerate(out):
        assert "exception" not in o, f"rank {r}:\n{o['exception']}"
    return out


def needs_gloo():
    """A module's pytestmark for multi-process tests over gloo."""
    import pytest
    return pytest.mark.skipif(not torch.distributed.is_available()
                              or not torch.distributed.is_gloo_available(),
                              reason="torch.distributed with gloo is not available")
