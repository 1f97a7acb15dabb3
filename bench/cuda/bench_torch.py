"""bench_torch.py — bitexact.torch on CUDA gradients against PyTorch's own
gradient-norm and clipping, on the same GPU, data and sizes as
bench/cuda/bench_cuda.c:

  1 GiB of fp32 and of bf16 gradients, as one tensor and as ~1000 tensors
  of varied (log-uniform) sizes.

Methods, per case:
  torch norm        torch.linalg.vector_norm(torch.stack(torch._foreach_norm(g, 2)), 2)
                    (what get_total_norm / clip_grad_norm_(foreach=True) compute)
  torch clip        torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)
  bitexact norm     bitexact.torch.get_total_norm(grads)
  bitexact clip     bitexact.torch.clip_grad_norm_(params, max_norm)

Clipping is active (max_norm = norm / 2): every gradient is rewritten.
Gradients are restored from a copy before every timed clip, outside the
timing. Times: torch.cuda.Event pairs around each call on the current
stream (GPU time, which includes any host wait the call causes) and the
host time of the call; the median of --reps runs (default 20) after
warm-up (the first bitexact call per buffer set builds its plan). Ratios
are torch's time / bitexact's (> 1: bitexact faster).

Checks printed (not timed): bitexact's norm has the same bits for 1 and
~1000 tensors over the same bytes, and is within 1e-5 (fp32) / 1e-2 (bf16
result dtype) of torch's.

Exits 0 with "no GPU: not run" when torch, CUDA or a GPU is missing;
exits 1 if bitexact's CUDA path fails (the torch rows are still printed).

  python3 bench/cuda/bench_torch.py [--quick] [--reps N] [--mib M]
  python3 bench/cuda/bench_torch.py --device cpu --mib 16   # dry run of this script, no GPU
"""
import argparse
import math
import statistics
import sys
import time


DEVICE = "cuda"


def no_gpu(why):
    print(f"bench_torch: no GPU: not run ({why})")
    sys.exit(0)


def sizes_for(total, count, seed):
    """count sizes (multiples of 128 elements) summing to total, log-uniform."""
    import random
    rnd = random.Random(seed)
    if count == 1:
        return [total]
    w = [math.exp(math.log(1024) + rnd.random() * math.log(4096)) for _ in range(count)]
    s = sum(w)
    blocks = total // 128
    out = [int(x / s * blocks) * 128 for x in w[:-1]]
    out.append(total - sum(out))
    return out


def timed(torch, fn, reps, restore=None, warm=3):
    """Median GPU ms (events) and host us of fn() over reps runs."""
    if DEVICE == "cpu":  # dry run: host time only
        ms, host = [], []
        for _ in range(warm):
            if restore:
                restore()
            fn()
        for _ in range(reps):
            if restore:
                restore()
            t0 = time.perf_counter()
            fn()
            ms.append(1e3 * (time.perf_counter() - t0))
            host.append(1e3 * ms[-1])
        return statistics.median(ms), statistics.median(host)
    stream = torch.cuda.current_stream()
    for _ in range(warm):
        if restore:
            restore()
        fn()
    torch.cuda.synchronize()
    pairs, host = [], []
    for _ in range(reps):
        if restore:
            restore()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(stream)
        t0 = time.perf_counter()
        fn()
        host.append(1e6 * (time.perf_counter() - t0))
        b.record(stream)
        pairs.append((a, b))
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in pairs), statistics.median(host)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--mib", type=float, default=1024.0)
    ap.add_argument("--quick", action="store_true", help="256 MiB, 10 runs")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                    help="cpu: a dry run of this script on CPU tensors (no GPU figures)")
    args = ap.parse_args()
    global DEVICE
    DEVICE = args.device
    if args.quick:
        args.mib, args.reps = 256.0, 10
    args.reps = max(args.reps, 10)

    try:
        import torch
    except ImportError as e:
        no_gpu(f"torch is not installed: {e}")
    if DEVICE == "cuda" and not torch.cuda.is_available():
        no_gpu(f"torch {torch.__version__}: torch.cuda.is_available() is False")
    try:
        import bitexact
        import bitexact.torch as bt
        bx_error = None
        avail = getattr(bitexact, "cuda_available", None)
        if DEVICE == "cuda" and avail is not None and not avail():
            bx_error = "bitexact.cuda_available() is False (package built without the CUDA backend?)"
    except Exception as e:  # noqa: BLE001 - report whatever the import raised
        bt, bx_error = None, f"import bitexact.torch failed: {type(e).__name__}: {e}"

    dev = torch.device(DEVICE)
    name = torch.cuda.get_device_properties(dev).name if DEVICE == "cuda" else "CPU (dry run)"
    print(f"bench_torch: {name}, torch {torch.__version__}, "
          f"bitexact {getattr(sys.modules.get('bitexact'), '__version__', '?')}; "
          f"{args.mib:.0f} MiB of gradients; median of {args.reps} runs; GB = 1e9 bytes")
    nbytes = int(args.mib * 1048576) // 4096 * 4096

    rows, checks, failures = [], [], []
    for dtype in (torch.float32, torch.bfloat16):
        dname = "fp32" if dtype == torch.float32 else "bf16"
        n = nbytes // (4 if dtype == torch.float32 else 2)
        gen = torch.Generator(device=dev).manual_seed(0)
        flat = torch.randn(n, device=dev, dtype=torch.float32, generator=gen).mul_(1e-2).to(dtype)
        backup = flat.clone()
        pflat = torch.empty_like(flat)
        first_bits = None
        for count in (1, 1000):
            sizes = sizes_for(n, count, seed=count)
            grads = list(flat.split(sizes))
            params = [torch.nn.Parameter(p) for p in pflat.split(sizes)]
            for p, g in zip(params, grads):
                p.grad = g
            restore = lambda: flat.copy_(backup)  # noqa: E731
            restore()
            with torch.no_grad():
                tnorm = torch.linalg.vector_norm(
                    torch.stack(torch._foreach_norm(grads, 2.0)), 2.0)
                # fp64 reference (chunked: bounded memory), for the checks only
                ref = math.sqrt(sum(float(c.double().square().sum()) for c in flat.split(1 << 26)))
            max_norm = float(tnorm) / 2
            gb = nbytes / 1e9

            def torch_norm():
                with torch.no_grad():
                    return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads, 2.0)), 2.0)

            def torch_clip():
                return torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)

            t_norm = timed(torch, torch_norm, args.reps)
            t_clip = timed(torch, torch_clip, args.reps, restore)
            rows.append((dname, count, "torch norm (_foreach_norm)", *t_norm, gb, None))
            rows.append((dname, count, "torch clip_grad_norm_", *t_clip, 3 * gb, None))
            if bx_error is None:
                try:
                    restore()
                    bnorm = bt.get_total_norm(grads)
                    bits = float(bnorm).hex()  # widening to a Python float is exact
                    if first_bits is None:
                        first_bits = bits
                    elif bits != first_bits:
                        failures.append(f"{dname}: bitexact norm of 1 vs {count} tensors differs")
                    # bitexact returns torch's result dtype (fp32 / bf16), correctly
                    # rounded: within half an ulp of the fp64 reference (whose own
                    # error is ~1e-16); torch's error is shown for comparison
                    rel = abs(float(bnorm) - ref) / max(ref, 1e-300)
                    trel = abs(float(tnorm) - ref) / max(ref, 1e-300)
                    tol = 2.0 ** -24 if bnorm.dtype == torch.float32 else 2.0 ** -8
                    tol *= 1 + 1e-9
                    checks.append(f"{dname}, {count} tensor(s): fp64 reference {ref:.12g}; "
                                  f"bitexact {float(bnorm):.9g} ({bnorm.dtype}, rel. error "
                                  f"{rel:.2e}{'' if rel <= tol else ', TOO LARGE'}); torch "
                                  f"{float(tnorm):.9g} (rel. error {trel:.2e})")
                    if rel > tol:
                        failures.append(f"{dname}: bitexact's norm is {rel:.2e} from the fp64 reference")
                    b_norm = timed(torch, lambda: bt.get_total_norm(grads), args.reps)
                    b_clip = timed(torch, lambda: bt.clip_grad_norm_(params, max_norm), args.reps, restore)
                    rows.append((dname, count, "bitexact get_total_norm", *b_norm, gb, t_norm[0]))
                    rows.append((dname, count, "bitexact clip_grad_norm_", *b_clip, 3 * gb, t_clip[0]))
                    restore()
                except Exception as e:  # noqa: BLE001 - reported, then exit 1
                    bx_error = f"bitexact.torch on CUDA tensors failed: {type(e).__name__}: {e}"
            del grads, params
        del flat, backup, pflat
        if DEVICE == "cuda":
            torch.cuda.empty_cache()

    print(f"\n{'dtype':5} {'tensors':>7}  {'method':28} {'median ms':>10} {'host us':>9} "
          f"{'GB/s':>8} {'torch/bitexact':>14}")
    for dname, count, what, ms, host_us, gb, ref in rows:
        ratio = f"{ref / ms:14.2f}" if ref else f"{'':14}"
        print(f"{dname:5} {count:7d}  {what:28} {ms:10.3f} {host_us:9.1f} {gb / ms * 1e3:8.0f} {ratio}")
    print("\nGB/s: norm rows count one read of the gradients, clip rows three passes "
          "(norm read, scale read, scale write).")
    for c in checks:
        print("check:", c)
    if bx_error:
        print(f"\nbitexact rows NOT RUN: {bx_error}")
    for f in failures:
        print("FAILED:", f)
    return 1 if (bx_error or failures) else 0


if __name__ == "__main__":
    sys.exit(main())
