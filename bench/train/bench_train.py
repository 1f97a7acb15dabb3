#!/usr/bin/env python3
"""bench_train.py -- tokens per second of `bitexact train` (the built-in tiny
GLM-4.5 MoE config, or --config FILE such as bench/configs/glm-34m.json;
synthetic corpus):

  * --mode invariant vs --mode ordinary, same layout, 1 and 2 threads;
  * against transformers' Glm4MoeForCausalLM training step (torch eager, CPU,
    fp32, attn_implementation="eager"), loaded with from_pretrained(DIR) from
    the checkpoint `bitexact train --steps 0 --save DIR` writes: same config,
    same batch (B sequences of L tokens, L predictions each), same threads
    (torch.set_num_threads), token-mean cross-entropy, clip_grad_norm_(1.0),
    AdamW(lr 1e-3, weight decay 0.01), zero_grad(set_to_none=True);
  * scaling over MPI ranks: mpirun -np 1/2 (threads 1), the same global batch;
    and its ceiling on this machine: two independent 1-thread runs at once
    ("pair t1": tokens of both over the wall time of both), against one.

Timing. Steady state, the figure compared: bitexact: the in-process mean
step time of steps 1 .. N-1 of `bitexact train --steps N --json`
(`step_seconds`: the first step, which states no grid from a history and
runs two passes, and allocates, is left out, as torch's warm-up steps
are); torch: one long-lived worker process (imported once); per
measurement it sets the threads, runs 2 warm-up steps, then times N steps
with perf_counter (and process_time). Beside it, bitexact's whole-run
figure: the wall time of `--steps N` minus that of the same command with
`--steps 0` (process start, model init, the synthetic corpus, mpirun
start-up), divided by N, the first step included. Tokens per step = B*L.
Each figure is also given per CPU-second (bitexact: the rusage of the
command and its descendants, whole run; torch: the worker's process_time),
which at 1 thread is the work whatever else runs on a shared machine. The runs are
interleaved (A, B, C, ... A, B, C, ...) --reps times; the report gives the
median of each and the median of the per-repetition ratios.

Usage: python3 bench/train/bench_train.py [--bin build/bitexact] [--reps 5]
       [--steps 20] [--threads 1,2] [--ranks 1,2] [--config FILE.json]
       [--batch 8] [--seq-len 64] [--no-torch] [--json FILE]
The 34M config: --config bench/configs/glm-34m.json --seq-len 256 --steps 3
(its first step takes two passes: --steps 3 counts it as a third of the time).
"""
import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

WORKER = r'''
import sys, time, torch
from transformers import Glm4MoeForCausalLM
ckpt, B, L = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.manual_seed(0)
model, info = Glm4MoeForCausalLM.from_pretrained(ckpt, attn_implementation="eager",
                                                 dtype=torch.float32, output_loading_info=True)
bad = {k: v for k, v in info.items() if v}
if bad:
    sys.exit("bench_train: from_pretrained: %r" % bad)
model.train()
V = model.config.vocab_size
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
x = torch.randint(0, V, (B, L + 1), generator=torch.Generator().manual_seed(0))
inp, tgt = x[:, :L].contiguous(), x[:, 1:].reshape(-1).contiguous()
def step():
    logits = model(input_ids=inp).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), tgt)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss.item()
print("ready", torch.__version__, flush=True)
for line in sys.stdin:
    threads, n = map(int, line.split())
    torch.set_num_threads(threads)
    step(); step()
    t, c = time.perf_counter(), time.process_time()
    for _ in range(n):
        step()
    print(time.perf_counter() - t, time.process_time() - c, flush=True)
'''


def cpu_model():
    try:
        out = subprocess.run(["lscpu"], stdout=subprocess.PIPE, text=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def commit():
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], stdout=subprocess.PIPE,
                              text=True, cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    except OSError:
        return "unknown"


class Bench:
    def __init__(self, a):
        self.a = a
        self.mpirun = None
        if shutil.which("mpirun"):
            self.mpirun = ["mpirun", "--oversubscribe"]
            if os.geteuid() == 0:
                self.mpirun.insert(1, "--allow-run-as-root")

    def train_cmd(self, steps, threads, mode, ranks):
        cmd = [self.a.bin, "train", "--steps", str(steps), "--threads", str(threads), "--mode", mode,
               "--global-batch", str(self.a.batch), "--seq-len", str(self.a.seq_len), "-q",
               "--json"]
        if self.a.config:
            cmd += ["--config", self.a.config]
        if ranks:
            cmd = self.mpirun + ["-np", str(ranks)] + cmd
        return cmd

    def wall(self, cmd):
        """(wall seconds, CPU seconds of the command and its descendants, the summary's
        in-process step_seconds: steps after the first; None for --steps 0)"""
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.perf_counter()
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        dt = time.perf_counter() - t
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        if p.returncode != 0:
            sys.exit("bench_train: %s: exit %d: %s" % (" ".join(cmd), p.returncode, p.stderr.decode()[-500:]))
        steady = None
        try:
            steady = json.loads(p.stdout.decode()).get("step_seconds")
        except ValueError:
            pass
        return dt, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime), steady

    def pair(self):
        """(wall, CPU) seconds per step of two concurrent independent 1-thread runs, per run's
        step: the most two processes get out of the machine's cores (no communication)"""
        def both(steps):
            r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            t = time.perf_counter()
            ps = [subprocess.Popen(self.train_cmd(steps, 1, "invariant", 0) + ["--seed", str(k + 1)],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE) for k in range(2)]
            steady = []
            for p in ps:
                out, err = p.communicate()
                if p.returncode != 0:
                    sys.exit("bench_train: pair: exit %d: %s" % (p.returncode, err.decode()[-500:]))
                if steps:
                    steady.append(json.loads(out.decode())["step_seconds"])
            dt = time.perf_counter() - t
            r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            return dt, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime), steady
        n = self.a.steps
        (w_n, c_n, st), (w_0, c_0, _) = both(n), both(0)
        # steady: the two runs overlap only if both are running; their mean step over 2
        return statistics.mean(st) / 2, (w_n - w_0) / n / 2, (c_n - c_0) / n / 2

    def bx(self, threads, mode, ranks=0):
        """(steady wall, whole-run wall, CPU) seconds per step of bitexact train (ranks 0: no
        mpirun; steady: rank 0's in-process step_seconds)"""
        n = self.a.steps
        w_n, c_n, steady = self.wall(self.train_cmd(n, threads, mode, ranks))
        w_0, c_0, _ = self.wall(self.train_cmd(0, threads, mode, ranks))
        return steady, (w_n - w_0) / n, (c_n - c_0) / n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default="build/bitexact")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--ranks", default="1,2")
    ap.add_argument("--config", default=None, help="a config.json (default: the built-in tiny one)")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--json", help="write the raw figures here")
    a = ap.parse_args()
    threads = [int(t) for t in a.threads.split(",") if t]
    ranks = [int(r) for r in a.ranks.split(",") if r]
    b = Bench(a)
    if not b.mpirun:
        print("note: no mpirun: no rank scaling")
        ranks = []
    tokens = a.batch * a.seq_len

    tmp = tempfile.mkdtemp(prefix="bench_train.")
    worker = None
    try:
        ckpt = os.path.join(tmp, "init")
        subprocess.run([a.bin, "train", "--steps", "0", "--save", ckpt, "-q"] +
                       (["--config", a.config] if a.config else []), check=True,
                       stdout=subprocess.DEVNULL)
        if not a.no_torch:
            worker = subprocess.Popen([sys.executable, "-c", WORKER, ckpt, str(a.batch), str(a.seq_len)],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                      env=dict(os.environ, TQDM_DISABLE="1"))
            ready = worker.stdout.readline().split()
            if not ready or ready[0] != "ready":
                sys.exit("bench_train: the torch worker did not start")
            torch_version = ready[1]

        def torch_step(t):
            worker.stdin.write("%d %d\n" % (t, a.steps))
            worker.stdin.flush()
            w, c = map(float, worker.stdout.readline().split())
            return w / a.steps, w / a.steps, c / a.steps

        cases = []  # (name, fn)
        for t in threads:
            cases.append(("invariant t%d" % t, lambda t=t: b.bx(t, "invariant")))
            cases.append(("ordinary t%d" % t, lambda t=t: b.bx(t, "ordinary")))
            if worker:
                cases.append(("torch t%d" % t, lambda t=t: torch_step(t)))
        for r in ranks:
            cases.append(("mpirun -np %d t1" % r, lambda r=r: b.bx(1, "invariant", r)))
        if 2 in ranks:
            cases.append(("pair t1", b.pair))

        sec = {name: [] for name, _ in cases}
        run = {name: [] for name, _ in cases}
        cpu = {name: [] for name, _ in cases}
        for rep in range(a.reps):
            for name, fn in cases:
                w, wr, c = fn()
                sec[name].append(w)
                run[name].append(wr)
                cpu[name].append(c)
            print("rep %d: " % rep + ", ".join("%s %.0f" % (n, tokens / sec[n][-1]) for n, _ in cases),
                  flush=True)
    finally:
        if worker:
            worker.stdin.close()
            worker.wait()
        shutil.rmtree(tmp, ignore_errors=True)

    def med_tps(name, d=sec):
        return statistics.median(tokens / s for s in d[name])

    def med_ratio(num, den, d=sec):  # per repetition: tokens/s of num over tokens/s of den
        return statistics.median(sd / sn for sn, sd in zip(d[num], d[den]))

    print()
    print("CPU: %s; commit %s; config %s; %d reps x %d steps of %d x %d tokens; medians"
          % (cpu_model(), commit(), a.config or "tiny (built-in)", a.reps, a.steps, a.batch, a.seq_len))
    if worker:
        print("torch %s" % torch_version)
    print("%-18s %12s %22s %22s" % ("case", "tokens/s", "tokens/s, whole run", "tokens per CPU-second"))
    for name, _ in cases:
        print("%-18s %12.0f %22.0f %22.0f" % (name, med_tps(name), med_tps(name, run),
                                               med_tps(name, cpu)))
    ratios = {}
    for t in threads:
        ratios["invariant/ordinary t%d" % t] = med_ratio("invariant t%d" % t, "ordinary t%d" % t)
        if worker:
            ratios["invariant/torch t%d" % t] = med_ratio("invariant t%d" % t, "torch t%d" % t)
            ratios["ordinary/torch t%d" % t] = med_ratio("ordinary t%d" % t, "torch t%d" % t)
    if 1 in threads:  # 1 thread: CPU time is the work, whatever else runs
        ratios["invariant/ordinary t1 (whole run)"] = med_ratio("invariant t1", "ordinary t1", run)
        ratios["invariant/ordinary t1 (CPU time)"] = med_ratio("invariant t1", "ordinary t1", cpu)
        if worker:
            ratios["invariant/torch t1 (CPU time)"] = med_ratio("invariant t1", "torch t1", cpu)
    for r in ranks[1:]:
        ratios["np%d/np%d" % (r, ranks[0])] = med_ratio("mpirun -np %d t1" % r, "mpirun -np %d t1" % ranks[0])
    if 2 in ranks and 1 in threads:  # the machine's ceiling for np 2 / np 1
        ratios["pair/one (2-process ceiling)"] = med_ratio("pair t1", "invariant t1")
    for k, v in ratios.items():
        print("%-34s %6.3f" % (k, v))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"cpu": cpu_model(), "commit": commit(), "tokens_per_step": tokens,
                       "steps": a.steps, "seconds_per_step": sec, "run_seconds_per_step": run,
                       "cpu_seconds_per_step": cpu,
                       "ratios": ratios}, f, indent=1)


if __name__ == "__main__":
    main()
