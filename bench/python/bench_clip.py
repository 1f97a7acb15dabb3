"""bench_clip.py — bitexact.torch.clip_grad_norm_ against
torch.nn.utils.clip_grad_norm_ (foreach=True and foreach=False), in one run,
on the same data and the same thread count.

Workloads
  gpt2-small  the 148 fp32 gradient tensors of GPT-2 small (124,439,808
              parameters), N(0, 1e-3^2). Two cases: clipping active
              (max_norm 1.0, the norm is ~11) and inactive (max_norm 1e9,
              coefficient 1: torch still multiplies every gradient by 1,
              bitexact skips the write). Also the norm alone (get_total_norm).
  tiny        10,000 tensors of 4 fp32 elements: per-tensor overhead
              (Python + binding + C bookkeeping), reported per tensor.
Methods: bitexact's drop-in (eager: it does not go through the custom
ops), the custom op called directly (torch.ops.bitexact.clip_grad_norm_ /
total_norm: the dispatcher's cost on top), and, unless --no-compile, the
drop-in inside a torch.compile(fullgraph=True) function (which calls the
op) next to torch's clip_grad_norm_ compiled the same way (inductor);
the compile happens in the warm-up call, outside the timings.
Every method is warmed up once; the repetitions interleave the methods and
the median is kept. Gradients are restored from a copy before every timed
clipping call (outside the timing), so every call sees the same data.
torch's and bitexact's thread counts are both torch.get_num_threads()
(or --threads). It checks that bitexact's norm is bitwise identical in
every repetition and within 1e-5 of torch's.

  python3 bench/python/bench_clip.py [--reps 11] [--threads T] [--json FILE] [--quick]
                                     [--no-compile]
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch

import bitexact
import bitexact.torch as bt


def cpu_model():
    """The CPU model name (what `lscpu | grep 'Model name'` prints)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def gpt2_small_shapes(n_layer=12, d=768, vocab=50257, ctx=1024):
    shapes = [(vocab, d), (ctx, d)]
    for _ in range(n_layer):
        shapes += [(d,), (d,), (d, 3 * d), (3 * d,), (d, d), (d,),
                   (d,), (d,), (d, 4 * d), (4 * d,), (4 * d, d), (d,)]
    shapes += [(d,), (d,)]
    return shapes


def make_params(shapes, seed=0):
    g = torch.Generator().manual_seed(seed)
    params = []
    for s in shapes:
        p = torch.nn.Parameter(torch.empty(s))
        p.grad = torch.randn(s, generator=g) * 1e-3
        params.append(p)
    return params


def timed(fn, restore, reps):
    """Median wall time of fn() over reps calls, restore() before each."""
    out = []
    for _ in range(reps):
        restore()
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def run_suite(methods, restore, reps):
    """Interleaved repetitions; returns name -> list of seconds."""
    times = {name: [] for name in methods}
    for name, fn in methods.items():  # warm-up
        restore()
        fn()
    for _ in range(reps):
        for name, fn in methods.items():
            times[name] += timed(fn, restore, 1)
    return times


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=11)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--json", default=None)
    ap.add_argument("--quick", action="store_true", help="GPT-2 with 2 layers, 3 reps")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile methods")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    reps = 3 if args.quick else max(5, args.reps)

    shapes = gpt2_small_shapes(n_layer=2 if args.quick else 12)
    params = make_params(shapes)
    nparam = sum(p.numel() for p in params)
    saved = [p.grad.clone() for p in params]

    def restore():
        for p, s in zip(params, saved):
            p.grad.copy_(s)

    norms = set()

    def ours(max_norm):
        def f():
            norms.add(float(bt.clip_grad_norm_(params, max_norm, num_threads=threads)))
        return f

    def theirs(max_norm, foreach):
        return lambda: torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=foreach)

    grads = [p.grad for p in params]
    positions = list(range(len(params)))

    def op(max_norm):
        def f():
            norms.add(float(torch.ops.bitexact.clip_grad_norm_(
                grads, positions, max_norm, 2.0, False, "torch", "exact", threads)))
        return f

    def compiled(fn):
        # one compiled function per case (the compile runs in the warm-up)
        return torch.compile(fn, fullgraph=True)

    def ours_compiled(max_norm):
        cf = compiled(lambda: bt.clip_grad_norm_(params, max_norm, num_threads=threads))
        return lambda: norms.add(float(cf()))

    def theirs_compiled(max_norm):
        return compiled(lambda: torch.nn.utils.clip_grad_norm_(params, max_norm))

    results = {"threads": threads, "torch": torch.__version__, "isa": bitexact.isa(),
               "cpu": cpu_model(),
               "tensors": len(params), "parameters": nparam, "reps": reps, "cases": {},
               "loadavg_start": os.getloadavg()}
    print(f"bench_clip: {len(params)} fp32 tensors, {nparam:,} parameters, "
          f"{threads} threads (torch and bitexact), torch {torch.__version__}, "
          f"bitexact {bitexact.isa()} kernels, median of {reps}; CPU {results['cpu']}")

    torch_norm = float(torch.nn.utils.get_total_norm(grads))
    fp64_norm = float(torch.stack([(g.double() ** 2).sum() for g in grads]).sum().sqrt())
    exact64 = bitexact.total_norm(grads)  # the correctly rounded fp64 norm
    cases = {
        "clip (active, max_norm=1)": {
            "bitexact": ours(1.0),
            "bitexact op": op(1.0),
            "torch foreach=True": theirs(1.0, True),
            "torch foreach=False": theirs(1.0, False)},
        "clip (inactive, max_norm=1e9)": {
            "bitexact": ours(1e9),
            "bitexact op": op(1e9),
            "torch foreach=True": theirs(1e9, True),
            "torch foreach=False": theirs(1e9, False)},
        "norm only (get_total_norm)": {
            "bitexact": lambda: norms.add(float(bt.get_total_norm(grads, num_threads=threads))),
            "bitexact op": lambda: norms.add(float(torch.ops.bitexact.total_norm(
                grads, 2.0, False, "exact", threads))),
            "torch foreach=True": lambda: torch.nn.utils.get_total_norm(grads, foreach=True),
            "torch foreach=False": lambda: torch.nn.utils.get_total_norm(grads, foreach=False)},
    }
    if not args.no_compile:
        for case, mn in (("clip (active, max_norm=1)", 1.0),
                         ("clip (inactive, max_norm=1e9)", 1e9)):
            cases[case]["bitexact compiled"] = ours_compiled(mn)
            cases[case]["torch compiled"] = theirs_compiled(mn)
        cn = compiled(lambda: bt.get_total_norm(grads, num_threads=threads))
        cases["norm only (get_total_norm)"]["bitexact compiled"] = lambda: norms.add(float(cn()))
        cases["norm only (get_total_norm)"]["torch compiled"] = compiled(
            lambda: torch.nn.utils.get_total_norm(grads))
    for case, methods in cases.items():
        times = run_suite(methods, restore if case.startswith("clip") else (lambda: None), reps)
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"\n{case}")
        print(f"  {'method':<22}{'median ms':>11}{'GB/s read':>11}{'speedup':>10}")
        for name, t in med.items():
            print(f"  {name:<22}{t * 1e3:>11.2f}{nparam * 4 / t / 1e9:>11.2f}"
                  f"{med[name] and med['torch foreach=True'] / t:>9.2f}x")
        results["cases"][case] = {k: {"median_s": v, "all_s": times[k]} for k, v in med.items()}
        results["cases"][case]["speedup_vs_foreach"] = med["torch foreach=True"] / med["bitexact"]
        results["cases"][case]["speedup_vs_loop"] = med["torch foreach=False"] / med["bitexact"]
        results["cases"][case]["op_vs_foreach"] = med["torch foreach=True"] / med["bitexact op"]
        if "bitexact compiled" in med:
            results["cases"][case]["compiled_vs_torch_compiled"] = (
                med["torch compiled"] / med["bitexact compiled"])

    # ---- per-tensor overhead ----
    n_tiny = 10000
    tiny = [torch.nn.Parameter(torch.empty(4)) for _ in range(n_tiny)]
    for p in tiny:
        p.grad = torch.randn(4)
    tiny_grads = [p.grad for p in tiny]
    tiny_np = [g.numpy() for g in tiny_grads]
    over = {
        "bitexact.torch.clip_grad_norm_ (inactive)": lambda: bt.clip_grad_norm_(tiny, 1e9),
        "bitexact.torch.clip_grad_norm_ (active)": lambda: bt.clip_grad_norm_(tiny, 1e-30),
        "bitexact.torch.get_total_norm": lambda: bt.get_total_norm(tiny_grads),
        "torch.ops.bitexact.total_norm (the custom op)": lambda: torch.ops.bitexact.total_norm(
            tiny_grads, 2.0, False, "exact", 0),
        "bitexact.total_norm (NumPy arrays)": lambda: bitexact.total_norm(tiny_np),
        "torch clip_grad_norm_ foreach=True": lambda: torch.nn.utils.clip_grad_norm_(
            tiny, 1e9, foreach=True),
    }
    for fn in over.values():
        fn()
    ot = {k: [] for k in over}
    for _ in range(reps):
        for k, fn in over.items():
            for p in tiny:  # active clipping would drive them to zero
                p.grad.normal_()
            t0 = time.perf_counter()
            fn()
            ot[k].append(time.perf_counter() - t0)
    print(f"\nper-tensor cost, {n_tiny} tensors of 4 fp32 elements (whole call / tensors)")
    results["per_tensor_us"] = {}
    for k, v in ot.items():
        us = statistics.median(v) / n_tiny * 1e6
        results["per_tensor_us"][k] = us
        print(f"  {k:<45}{us:>8.3f} us/tensor")

    ours_norm = next(iter(norms))
    # fp64 accumulation of 1e8 positive terms is good to ~1e-13 relative
    ok = (len(norms) == 1 and abs(exact64 - fp64_norm) <= 1e-12 * fp64_norm
          and ours_norm == float(torch.tensor(exact64, dtype=torch.float32)))
    print(f"\nnorm: bitexact fp32 {ours_norm!r} (identical in all calls: "
          f"{'yes' if len(norms) == 1 else 'NO'}), bitexact fp64 {exact64!r}, "
          f"fp64-accumulated {fp64_norm!r}, torch fp32 {torch_norm!r} "
          f"(relative error {abs(torch_norm - exact64) / exact64:.2e})")
    print(f"bitexact norm identical in every call, agrees with the fp64 sum: "
          f"{'yes' if ok else 'NO'}")
    results["norms"] = {"bitexact_fp32": ours_norm, "bitexact_fp64": exact64,
                        "fp64_accumulated": fp64_norm, "torch": torch_norm}
    results["loadavg_end"] = os.getloadavg()
    print(f"load average at start {results['loadavg_start'][0]:.2f}, at end "
          f"{results['loadavg_end'][0]:.2f} (on {os.cpu_count()} CPUs; other load skews timings)")
    a = results["cases"]["clip (active, max_norm=1)"]
    i = results["cases"]["clip (inactive, max_norm=1e9)"]
    n = results["cases"]["norm only (get_total_norm)"]
    print(f"summary (vs torch foreach=True): clip active {a['speedup_vs_foreach']:.2f}x "
          f"(op {a['op_vs_foreach']:.2f}x), inactive {i['speedup_vs_foreach']:.2f}x "
          f"(op {i['op_vs_foreach']:.2f}x), norm {n['speedup_vs_foreach']:.2f}x "
          f"(op {n['op_vs_foreach']:.2f}x); overhead "
          f"{results['per_tensor_us']['bitexact.torch.clip_grad_norm_ (active)']:.2f} us/tensor")
    if not args.no_compile:
        print("compiled vs torch compiled: " + ", ".join(
            f"{k}: {v['compiled_vs_torch_compiled']:.2f}x"
            for k, v in results["cases"].items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
