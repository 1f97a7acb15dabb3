#!/usr/bin/env python3
"""Step time of the GLM-4.5 framework bindings (docs/train_python.md,
docs/benchmarks.md "Framework bindings: step time"): one training step of
the tiny config (8 x 64 tokens) by

- ``bitexact train`` (C): (wall of --steps 1+N) - (wall of --steps 1), / N,
  resumed from the same step-0 checkpoint (start-up and data excluded);
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


def c_step(cli, ck0, n, threads, dtype):
    def wall(steps):
        t = time.perf_counter()
        subprocess.run([cli, "train", "--resume", ck0, "--steps", str(steps), "-q",
                        "--threads", str(threads), "--compute-dtype", dtype], check=True,
                       capture_output=True)
        return time.perf_counter() - t
    return (wall(1 + n) - wall(1)) / n


def binding_step(fw, ck0, n, threads, compile_=False):
    from bitexact import _glm_run as g
    if fw == "torch":
        from bitexact._torch_glm import RUNNER
    else:
        from bitexact._paddle_glm import RUNNER
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
    a = ap.parse_args()
    import torch
    torch.set_num_threads(a.threads)
    try:
        import paddle  # noqa: F401
        fws = ["torch", "paddle"]
    except ImportError:
        fws = ["torch"]
    with tempfile.TemporaryDirectory() as d:
        ck0 = os.path.join(d, "ck0")
        subprocess.run([a.cli, "train", "--steps", "0", "--save", ck0, "-q", "--compute-dtype",
                        a.compute_dtype], check=True, capture_output=True)
        nat = ["native torch (transformers)"] + (["native paddle"] if "paddle" in fws else [])
        res = {k: [] for k in ["bitexact train"] + fws + ["torch --compile"] + nat}
        for _ in range(a.repeat):  # interleaved: the machine's noise hits every variant alike
            res["bitexact train"].append(c_step(a.cli, ck0, a.steps, a.threads, a.compute_dtype))
            for fw in fws:
                res[fw].append(binding_step(fw, ck0, a.steps, a.threads))
            res["torch --compile"].append(binding_step("torch", ck0, a.steps, a.threads, True))
            res["native torch (transformers)"].append(native_step(ck0, a.steps))
            if "paddle" in fws:
                res["native paddle"].append(native_step(ck0, a.steps, "glm_native_paddle"))
    med = {k: statistics.median(v) for k, v in res.items()}
    c, nat = med["bitexact train"], med["native torch (transformers)"]
    print(f"GLM-4.5 tiny config, 8 x 64 tokens per step, compute {a.compute_dtype} (native: fp32), "
          f"{a.threads} thread(s), {cpu_model()}, "
          f"median of {a.repeat} runs of {a.steps} steps")
    print(f"{'variant':32s} {'ms/step':>9s} {'/ bitexact train':>17s} {'/ native torch':>15s}")
    for k, v in med.items():
        print(f"{k:32s} {1e3 * v:9.1f} {v / c:17.2f} {v / nat:15.2f}")


if __name__ == "__main__":
    main()
