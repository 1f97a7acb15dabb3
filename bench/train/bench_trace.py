#!/usr/bin/env python3
"""The cost of `bitexact train --trace` (issue 28): per config, the step
time with and without --trace (the `--json` summary's step_seconds: the
mean of the steps after the first, in-process), interleaved runs, medians
and their ratio; the trace's bytes per step; and the time of `bitexact
diff --trace` on two equal traces (it reads and compares every entry: the
worst case). Prints one JSON object per config.

    python3 bench/train/bench_trace.py [--bin build/bitexact] [--reps 5]
        [--steps 4] [--threads 1] [--configs tiny,34m]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CONFIGS = {
    "tiny": [],  # the built-in config, 8 x 64 tokens
    "34m": ["--config", os.path.join(ROOT, "bench", "configs", "glm-34m.json"), "--seq-len", "256"],
}


def step_seconds(bin_, args):
    p = subprocess.run([bin_, "train", "--json", "-q", *args], capture_output=True, text=True,
                       check=True)
    return json.loads(p.stdout)["step_seconds"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bitexact"))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--configs", default="tiny,34m")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(a.bin, os.path.join(tmp, "bitexact"))  # a rebuild meanwhile changes nothing
        a.bin = os.path.join(tmp, "bitexact")
        for name in a.configs.split(","):
            base = [*CONFIGS[name], "--steps", str(a.steps), "--threads", str(a.threads)]
            tr = os.path.join(tmp, name + ".trace")
            off, on = [], []
            for _ in range(a.reps):  # interleaved: the machine's load hits both alike
                off.append(step_seconds(a.bin, base))
                on.append(step_seconds(a.bin, [*base, "--trace", tr]))
            size = os.path.getsize(tr)
            with open(tr, "rb") as f:
                header = len(f.readline())
            tr2 = os.path.join(tmp, name + "2.trace")
            subprocess.run([a.bin, "train", "-q", *base, "--trace", tr2], check=True,
                           capture_output=True)
            dt = []
            for _ in range(a.reps):
                t0 = time.perf_counter()
                p = subprocess.run([a.bin, "diff", "--trace", tr, tr2], capture_output=True)
                dt.append(time.perf_counter() - t0)
                assert p.returncode == 0, p.stdout
            moff, mon = statistics.median(off), statistics.median(on)
            print(json.dumps({"config": name, "threads": a.threads, "reps": a.reps,
                              "step_s_off": round(moff, 4), "step_s_trace": round(mon, 4),
                              "trace_over_off": round(mon / moff, 3),
                              "trace_bytes_per_step": (size - header) // a.steps,
                              "diff_trace_s": round(statistics.median(dt), 3),
                              "trace_steps": a.steps}), flush=True)


if __name__ == "__main__":
    main()
