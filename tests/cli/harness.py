"""Shared by the command-line tests (tests/cli/): the test registry, running
the binary, bit-exact assertions, and the tensors the cases write."""
import json
import math
import os
import struct
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stfiles  # noqa: E402

try:
    import numpy as np
    from safetensors.numpy import save_file as np_save
except ImportError:  # pragma: no cover - the runner reports it as a failure
    print("test_cli.py: needs numpy and safetensors: run scripts/cli_setup.sh", file=sys.stderr)
    print("0 passed, 1 failed")
    sys.exit(1)
try:
    import xxhash
except ImportError:  # pragma: no cover
    xxhash = None
try:
    import torch
    from safetensors.torch import save_file as torch_save
except Exception:  # ImportError, or a broken install
    torch = torch_save = None

TESTS = []


class Skip(Exception):
    pass


def test(fn):
    TESTS.append(fn)
    return fn


def need_torch():
    if torch is None:
        raise Skip("torch is not installed")


def need_xxhash():
    if xxhash is None:
        raise Skip("the xxhash Python package is not installed")


class Ctx:
    bin = None
    tmp = None
    mpi = False


def run(*args, check=None, stdin=None, stdout=subprocess.PIPE, env=None, timeout=300):
    """Runs the CLI; returns (rc, stdout, stderr)."""
    p = subprocess.run([Ctx.bin, *map(str, args)], stdout=stdout, stderr=subprocess.PIPE,
                       stdin=stdin if stdin is not None else subprocess.DEVNULL,
                       timeout=timeout, env=env)
    out = p.stdout.decode() if p.stdout is not None else ""
    err = p.stderr.decode()
    if check is not None and p.returncode != check:
        raise AssertionError(f"exit {p.returncode}, wanted {check}: {args}\nstdout: {out[-2000:]}\nstderr: {err[-2000:]}")
    return p.returncode, out, err


def run_json(*args, check=0):
    _, out, _ = run(*args, "--json", check=check)
    return json.loads(out)


def path(name):
    return os.path.join(Ctx.tmp, name)


def same_bits(a, b):
    return struct.pack("<d", a) == struct.pack("<d", b)


def assert_bits(got, want, what):
    if not (same_bits(got, want) or (math.isnan(got) and math.isnan(want))):
        raise AssertionError(f"{what}: got {got!r} ({float(got).hex()}), want {want!r} ({float(want).hex()})")


# ------------------------------------------------------------- data


def gradient_like(rng, n, scale):
    x = rng.standard_normal(n) * scale
    x[rng.random(n) < 0.05] = 0.0
    return x


def np_tensors(seed=1):
    """NumPy arrays in fp32/fp16/fp64 with awkward values included."""
    rng = np.random.default_rng(seed)
    t = {
        "layers.0.attn.weight": gradient_like(rng, 64 * 48, 1e-3).astype(np.float32).reshape(64, 48),
        "layers.0.mlp.experts.0.w1": gradient_like(rng, 4000, 3e-2).astype(np.float32),
        "layers.0.mlp.experts.1.w1": gradient_like(rng, 3000, 1e-4).astype(np.float16),
        "layers.1.mlp.experts.0.w1": gradient_like(rng, 2500, 1.0).astype(np.float64).reshape(50, 50),
        "embed.weight": gradient_like(rng, 8192, 5e-3).astype(np.float32).reshape(128, 64),
        "norm.bias": np.array([3.0e38, -3.0e38, 1e-45, -1.4e-45, 0.0, -0.0, 1.0], dtype=np.float32),
        "tiny.f64": np.array([5e-324, 1e-300, -2.5e-310, 1e300, 1.7976931348623157e308], dtype=np.float64),
        "halfs": np.array([6.0e-8, 65504.0, -65504.0, 1e-5, 0.0], dtype=np.float16),
        "scalar": np.array(2.5, dtype=np.float32),
        "empty": np.zeros((0, 3), dtype=np.float32),
    }
    return t


def np_values(a):
    return [float(v) for v in np.asarray(a, dtype=np.float64).ravel().tolist()]


def torch_tensors(seed=2):
    g = torch.Generator().manual_seed(seed)
    t = {
        "model.embed_tokens.weight": (torch.randn(256, 64, generator=g) * 2e-3).to(torch.bfloat16),
        "model.layers.0.self_attn.q_proj.weight": (torch.randn(64, 64, generator=g) * 1e-2).to(torch.bfloat16),
        "model.layers.0.mlp.experts.3.down_proj.weight": (torch.randn(32, 64, generator=g) * 1e-3),
        "model.layers.0.mlp.gate.weight": (torch.randn(8, 64, generator=g) * 0.1).to(torch.float16),
        "model.layers.0.input_layernorm.weight": (torch.randn(64, generator=g, dtype=torch.float64)),
        "model.norm.weight": torch.tensor([1e30, -2e-30, 0.0, 3.0], dtype=torch.bfloat16),
        "step": torch.tensor([37], dtype=torch.int64),
        "mask": torch.tensor([True, False, True]),
    }
    return t


def torch_values(t):
    return [float(v) for v in t.to(torch.float64).flatten().tolist()]


def raw_entries_np(tensors):
    names = {np.float32: "F32", np.float16: "F16", np.float64: "F64"}
    out = []
    for name, a in tensors.items():
        out.append((name, names[a.dtype.type], a.shape, a.tobytes()))
    return out
