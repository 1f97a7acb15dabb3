#!/usr/bin/env python3
"""bench/cli/bench.py — `bitexact norm` and `bitexact hash` on a >= 2 GiB
safetensors file, page cache warm, against a plain sequential read of the
same file, in one interleaved run: median of --reps repetitions each.

The file (written by the Python `safetensors` package: a mix of fp32 and,
with torch, bf16 tensors of 1 to 256 MiB, gradient-like values) is made in
--dir and deleted at the end unless --keep. Reports GB/s (1e9 bytes/s of
tensor data for the tool; of file bytes for the reads) and the ratio to the
read(2) rate. Target: norm with 2 threads >= 80% of the read rate.

    python3 bench/cli/bench.py --bin build/bitexact --seqread build/bench/cli/seqread
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time


def make_file(path, gib, seed=0):
    import numpy as np
    from safetensors.numpy import save_file
    rng = np.random.default_rng(seed)
    target = int(gib * (1 << 30))
    sizes_mib = [256, 192, 128, 96, 64, 48, 32, 16, 8, 4, 2, 1]
    tensors, total, k = {}, 0, 0
    bf16 = {}
    try:
        import torch
    except Exception:
        torch = None
    while total < target:
        mib = sizes_mib[k % len(sizes_mib)]
        n = (mib << 20) // 4
        scale = 10.0 ** rng.uniform(-5, -1)
        # gradient-like: Gaussian with a per-tensor scale, 5% exact zeros
        x = rng.standard_normal(n, dtype=np.float32) * np.float32(scale)
        x[rng.random(n) < 0.05] = 0
        name = f"model.layers.{k // 4}.block{k % 4}.weight"
        if torch is not None and k % 3 == 2:
            bf16[name] = torch.from_numpy(x).to(torch.bfloat16)
            total += n * 2
        else:
            tensors[name] = x.reshape(-1, 1024) if n % 1024 == 0 else x
            total += n * 4
        k += 1
    if bf16:
        from safetensors.torch import save_file as tsave
        tensors = {k: torch.from_numpy(v) for k, v in tensors.items()}
        tensors.update(bf16)
        tsave(tensors, path)
    else:
        save_file(tensors, path)
    return total


def timed(cmd):
    sink = subprocess.DEVNULL if cmd[0] == "cat" else subprocess.PIPE
    t0 = time.perf_counter()
    p = subprocess.run(cmd, stdout=sink, stderr=subprocess.PIPE)
    t = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"bench: {' '.join(cmd)} failed: {p.stderr.decode()[-500:]}")
    return t, p.stdout.decode() if p.stdout is not None else ""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/bitexact")
    ap.add_argument("--seqread", default="build/bench/cli/seqread")
    ap.add_argument("--dir", default=os.environ.get("BENCH_DIR", "build"))
    ap.add_argument("--gib", type=float, default=2.25)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--json", help="write the results here too")
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    free = shutil.disk_usage(a.dir).free
    if free < (a.gib + 1) * (1 << 30):
        raise SystemExit(f"bench: {a.dir} has {free / 2**30:.1f} GiB free; need {a.gib + 1:.1f}")
    path = os.path.join(a.dir, "bench_cli.safetensors")
    try:
        t0 = time.perf_counter()
        data_bytes = make_file(path, a.gib)
        file_bytes = os.path.getsize(path)
        print(f"file: {path}: {file_bytes / 2**30:.2f} GiB ({data_bytes / 2**30:.2f} GiB of tensor data), "
              f"written in {time.perf_counter() - t0:.1f} s", flush=True)
        subprocess.run(["cat", path], stdout=subprocess.DEVNULL, check=True)  # warm the page cache
        runs = {
            "read(2) 128 KiB blocks": ([a.seqread, "read", path], "self"),
            "mmap, sum of words, 1 thread": ([a.seqread, "mmap", path], "self"),
            "cat > /dev/null": (["cat", path], file_bytes),
            "bitexact norm --threads 1": ([a.bin, "norm", "-q", "--threads", "1", path], data_bytes),
            "bitexact norm --threads 2": ([a.bin, "norm", "-q", "--threads", "2", path], data_bytes),
            "bitexact hash --threads 1": ([a.bin, "hash", "-q", "--threads", "1", path], data_bytes),
            "bitexact hash --threads 2": ([a.bin, "hash", "-q", "--threads", "2", path], data_bytes),
        }
        times = {k: [] for k in runs}
        outputs = {}
        for _ in range(a.reps):  # interleaved, so drift hits every row alike
            for k, (cmd, nbytes) in runs.items():
                t, out = timed(cmd)
                if nbytes == "self":
                    t = float(out.split()[1])  # the reader's own clock
                times[k].append(t)
                outputs.setdefault(k, out)
        if outputs["bitexact norm --threads 1"] != outputs["bitexact norm --threads 2"]:
            raise SystemExit("bench: norm output depends on the thread count")
        med = {k: statistics.median(v) for k, v in times.items()}
        rate = {k: (file_bytes if runs[k][1] == "self" else runs[k][1]) / med[k] / 1e9 for k in runs}
        # the plain sequential read: the faster of read(2) and cat
        base = max(rate["read(2) 128 KiB blocks"], rate["cat > /dev/null"])
        print(f"median of {a.reps}, page cache warm; GB/s = 1e9 bytes/s; "
              f"ratio = rate / plain sequential read rate ({base:.2f} GB/s, the faster of read(2) and cat)")
        print(f"{'what':34} {'median s':>9} {'GB/s':>7} {'ratio':>6}   min..max s")
        for k in runs:
            print(f"{k:34} {med[k]:9.3f} {rate[k]:7.2f} {rate[k] / base:6.2f}   "
                  f"{min(times[k]):.3f}..{max(times[k]):.3f}")
        norm2 = rate["bitexact norm --threads 2"] / base
        print(f"target norm (2 threads) >= 0.80 x read rate: {norm2:.2f} -> "
              f"{'met' if norm2 >= 0.8 else 'NOT met'}")
        print("norm result:", outputs["bitexact norm --threads 2"].split()[0])
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"file_bytes": file_bytes, "data_bytes": data_bytes, "reps": a.reps,
                           "median_s": med, "gb_per_s": rate, "times_s": times}, f, indent=2)
    finally:
        if not a.keep and os.path.exists(path):
            os.unlink(path)


if __name__ == "__main__":
    sys.exit(main())
