#!/usr/bin/env python3
"""bench_math_torch.py — bitexact's elementwise math against torch's, interleaved.

    python3 bench/bench_math_torch.py --bitexact build/libbitexact.so [--n N]
        [--threads 1,2] [--reps R] [--funcs exp,sigmoid,...]

For each function (bx_exp, bx_log, bx_sigmoid, bx_silu, bx_rsqrt, bx_sin,
bx_cos through ctypes, fp32 tensors of N elements, out of place) and each
thread count (bx_math_opts.num_threads; torch.set_num_threads), one rep is
one torch timing then one bitexact timing on the same input and output
tensors, each at least 20 ms of back-to-back calls after a warm-up, so a
machine shared with other work slows both alike. Printed per function and
thread count: the median over reps of each one's ns/element and Gelem/s,
and the median over reps of the per-rep ratio torch time / bitexact time
(= bitexact's throughput as a fraction of torch's; >= 0.5 is the issue's
target). At 1 thread the times are the calling thread's CPU time (torch
and bitexact both compute on the calling thread then), so that other
programs on a shared machine do not count (--wall: wall time); at 2
threads wall time. Inputs as bench/bench_math.c: activations 2 N(0,1) (log, rsqrt:
their absolute values), RoPE-like angles uniform in [0, 2^17) for sin/cos.
torch's results are not compared (they are not correctly rounded); the
script checks that bitexact's agree with torch's float64 reference
rounded to fp32 in at least 99.9% of the elements and within 1 ulp in all
but NaN-free inputs, a sanity check of the call.
"""
import argparse
import ctypes
import os
import statistics
import time

import torch


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class MathOpts(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("num_threads", ctypes.c_int)]


def view(t, shape):
    return DLTensor(ctypes.c_void_p(t.data_ptr()), DLDevice(1, 0), 1, DLDataType(2, 32, 1),
                    shape, None, 0)


def time_call(fn, clock):
    calls, t0 = 0, clock()
    while True:
        fn()
        calls += 1
        t1 = clock()
        if t1 - t0 >= 0.02:
            return (t1 - t0) / calls


TORCH = {
    "exp": lambda x, y: torch.exp(x, out=y),
    "log": lambda x, y: torch.log(x, out=y),
    "sigmoid": lambda x, y: torch.sigmoid(x, out=y),
    "silu": lambda x, y: torch.ops.aten.silu.out(x, out=y),
    "rsqrt": lambda x, y: torch.rsqrt(x, out=y),
    "sin": lambda x, y: torch.sin(x, out=y),
    "cos": lambda x, y: torch.cos(x, out=y),
}

REF64 = {
    "exp": torch.exp, "log": torch.log, "sigmoid": torch.sigmoid,
    "silu": torch.nn.functional.silu, "rsqrt": torch.rsqrt, "sin": torch.sin, "cos": torch.cos,
}


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bitexact", required=True, help="path of libbitexact.so")
    ap.add_argument("--n", type=int, default=1 << 20)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--funcs", default="exp,log,sigmoid,silu,rsqrt,sin,cos")
    ap.add_argument("--wall", action="store_true", help="wall time at 1 thread too")
    a = ap.parse_args()
    lib = ctypes.CDLL(os.path.abspath(a.bitexact))
    lib.bx_isa_name.restype = ctypes.c_char_p
    threads = [int(t) for t in a.threads.split(",")]
    n = a.n
    shape = (ctypes.c_int64 * 1)(n)
    print(f"# bench_math_torch: N = {n}, {a.reps} reps, torch {torch.__version__} "
          f"(CPU capability {torch.backends.cpu.get_cpu_capability()}), "
          f"bitexact ISA {lib.bx_isa_name().decode()}, CPU {cpu_model()}, {os.cpu_count()} CPUs")
    print(f"{'function':8} {'thr':>3} {'torch ns':>9} {'bx ns':>9} {'torch Ge/s':>10} "
          f"{'bx Ge/s':>8} {'bx/torch':>8} {'min..max':>12}")
    g = torch.Generator().manual_seed(42)
    for name in a.funcs.split(","):
        if name in ("sin", "cos"):
            x = torch.rand(n, generator=g, dtype=torch.float64).mul_(131072.0).float()
        else:
            x = (2.0 * torch.randn(n, generator=g, dtype=torch.float64)).float()
            if name in ("log", "rsqrt"):
                x = x.abs()
        y, yt = torch.empty(n), torch.empty(n)
        xd, yd = view(x, shape), view(y, shape)
        fn = getattr(lib, "bx_" + name)
        fn.argtypes = [ctypes.POINTER(DLTensor), ctypes.POINTER(DLTensor), ctypes.POINTER(MathOpts)]
        for t in threads:
            torch.set_num_threads(t)
            opts = MathOpts(ctypes.sizeof(MathOpts), t)
            tf = lambda: TORCH[name](x, yt)
            bf = lambda: fn(ctypes.byref(xd), ctypes.byref(yd), ctypes.byref(opts))
            if bf() != 0:
                raise SystemExit(f"bx_{name} failed")
            tf()
            # 1 thread: this thread's CPU time (both run on the calling thread;
            # on a shared machine wall time would count other programs' slices)
            clock = time.thread_time if t == 1 and not a.wall else time.perf_counter
            tt, tb, ratios = [], [], []
            for _ in range(a.reps):
                t1 = time_call(tf, clock)
                t2 = time_call(bf, clock)
                tt.append(t1)
                tb.append(t2)
                ratios.append(t1 / t2)
            mt, mb, mr = statistics.median(tt), statistics.median(tb), statistics.median(ratios)
            print(f"{name:8} {t:3d} {mt * 1e9 / n:9.3f} {mb * 1e9 / n:9.3f} {n / mt * 1e-9:10.3f} "
                  f"{n / mb * 1e-9:8.3f} {mr:8.2f} {min(ratios):5.2f}..{max(ratios):5.2f}",
                  flush=True)
        ref = REF64[name](x.double()).float()
        same = (y.view(torch.int32) == ref.view(torch.int32)).float().mean().item()
        ulps = (y.view(torch.int32).long() - ref.view(torch.int32).long()).abs().max().item()
        if same < 0.999 or ulps > 1:
            raise SystemExit(f"bx_{name}: only {same:.5f} equal to float64-rounded torch, "
                             f"max {ulps} ulp apart")


if __name__ == "__main__":
    main()
