#!/usr/bin/env python3
"""Step time of the GLM-4.5 framework bindings (docs/train_python.md,
docs/benchmarks.md "Framework bindings: step time"): one training step of
the tiny config (8 x 64 tokens), or of --config FILE.json with
--seq-len / --global-batch (e.g. bench/configs/glm-34m.json, 8 x 256), by

- ``bitexact train`` (C): the mean wall time of steps 2 .. 1+N that it
  measures itself (``--json``'s ``step_seconds``), resumed from the same
  step-0 checkpoint;
- the torch binding and the Paddle binding (``python -m bitexact.train``'s
  Run.step, in process), and the torch binding under torch.compile
  (``--compile``: fullgraph=True, the layers as custom ops; compiled in the
  warm-up step);
- the native-ops baselines: transformers' Glm4MoeForCausalLM with torch's
  autograd, clip_grad_norm_ and AdamW (bench/python/glm_native.py), and the
  same formula in Paddle's eager ops with ClipGradByGlobalNorm and
  paddle.optimizer.AdamW (bench/python/glm_native_paddle.py).

All at the same thread count (--threads; torch.set_num_threads and the
kernels' num_threads). Each figure is the median over --repeat runs of the
mean of --steps steps (after one warm-up step); ratios are against
`bitexact train` and the native baseline measured in the same run.

    python3 bench/python/bench_train.py [--cli build/bitexact] [--threads 1]
        [--config FILE.json --seq-len L --global-batch B] [--variants LIST]

--variants: a comma list of c, torch, paddle, compile, native, native-paddle
(default: all there are).
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def cpu_model():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def c_step(cli, ck0, n, threads, dtype, shape=()):
    """`bitexact train`'s own in-process mean of the steps after the first
    (its --json summary's step_seconds): the same warm-up and timing as
    the bindings' figure, no process start-up in it."""
    import json
    p = subprocess.run([cli, "train", "--resume", ck0, "--steps", str(1 + n), "-q", "--json",
                        "--threads", str(threads), "--compute-dtype", dtype] + list(shape),
                       check=True, capture_output=True, text=True)
    return json.loads(p.stdout.strip().splitlines()[-1])["step_seconds"]


def binding_step(fw, ck0, n, threads, compile_=False):
    from bitexact.train import _run as g
    if fw == "torch":
        from bitexact.torch._glm import RUNNER
    else:
        from bitexact.paddle._glm import RUNNER
    a = g.parse_args(["--framework", fw, "--resume", ck0, "--steps", str(n + 1), "--threads",
                      str(threads)] + (["--compile"] if compile_ else []))
    r = g.Run(a, RUNNER)
    r.step(0)  # warm-up (with --compile: the forward and backward graphs compiled)
    t = time.perf_counter()
    for s in range(1, n + 1):
        r.step(s)
    return (time.perf_counter() - t) / n


def native_step(ck0, n, mod="glm_native"):
    import importlib
    r = importlib.import_module(mod).NativeRun(ck0)
    r.step(0)
    t = time.perf_counter()
    for s in range(1, n + 1):
        r.step(s)
    return (time.perf_counter() - t) / n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", default=os.path.join(HERE, "..", "..", "build", "bitexact"))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--compute-dtype", choices=("fp32", "bf16"), default="fp32",
                    help="of bitexact train and the bindings (the native baseline stays fp32)")
    ap.add_argument("--config", help="a config.json (default: the tiny config)")
    ap.add_argument("--seq-len", type=int)
    ap.add_argument("--global-batch", type=int)
    ap.add_argument("--variants", default="c,torch,paddle,compile,native,native-paddle")
    a = ap.parse_args()
    want = set(a.variants.split(","))
    import torch
    torch.set_num_threads(a.threads)
    try:
        import paddle  # noqa: F401
        fws = [f for f in ("torch", "paddle") if f in want]
    except ImportError:
        fws = [f for f in ("torch",) if f in want]
    shape = []
    for flag, v in (("--config", a.config), ("--seq-len", a.seq_len),
                    ("--global-batch", a.global_batch)):
        if v is not None:
            shape += [flag, str(v)]
    with tempfile.TemporaryDirectory() as d:
        ck0 = os.path.join(d, "ck0")
        subprocess.run([a.cli, "train", "--steps", "0", "--save", ck0, "-q", "--compute-dtype",
                        a.compute_dtype] + shape, check=True, capture_output=True)
        resume_shape = shape[2:] if a.config else shape  # the config comes from the checkpoint
        runs = {"c": ("bitexact train", lambda: c_step(a.cli, ck0, a.steps, a.threads,
                                                       a.compute_dtype, resume_shape)),
                "compile": ("torch --compile", lambda: binding_step("torch", ck0, a.steps,
                                                                    a.threads, True)),
                "native": ("native torch (transformers)", lambda: native_step(ck0, a.steps)),
                "native-paddle": ("native paddle", lambda: native_step(ck0, a.steps,
                                                                       "glm_native_paddle"))}
        for fw in fws:
            runs[fw] = (fw + " binding", lambda fw=fw: binding_step(fw, ck0, a.steps, a.threads))
        order = [k for k in ("c", "torch", "paddle", "compile", "native", "native-paddle")
                 if k in want and k in runs and (k != "native-paddle" or "paddle" in fws
                                                 or "paddle" in want)]
        res = {runs[k][0]: [] for k in order}
        for _ in range(a.repeat):  # interleaved: the machine's noise hits every variant alike
            for k in order:
                res[runs[k][0]].append(runs[k][1]())
    med = {k: statistics.median(v) for k, v in res.items()}
    c = med.get("bitexact train")
    nat = med.get("native torch (transformers)")
    what = f"config {a.config}" if a.config else "GLM-4.5 tiny config"
    print(f"{what}, {a.global_batch or 8} x {a.seq_len or 64} tokens per step, compute "
          f"{a.compute_dtype} (native: fp32), {a.threads} thread(s), {cpu_model()}, "
          f"median of {a.repeat} runs of {a.steps} steps")
    print(f"{'variant':32s} {'ms/step':>9s} {'/ bitexact train':>17s} {'/ native torch':>15s}")
    for k, v in med.items():
        rc = f"{v / c:17.2f}" if c else f"{'-':>17s}"
        rn = f"{v / nat:15.2f}" if nat else f"{'-':>15s}"
        print(f"{k:32s} {1e3 * v:9.1f} {rc} {rn}")


if __name__ == "__main__":
    main()
