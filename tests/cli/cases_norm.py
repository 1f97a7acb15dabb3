"""`bitexact norm`: exact norms checked bit for bit against stfiles.ref_norm."""
import json
import math
import os
import shutil
import struct
import subprocess

import stfiles
from harness import *  # noqa: F401,F403 - the shared helpers and data
from harness import np, np_save, torch, torch_save, xxhash  # noqa: F401


# ------------------------------------------------------------- norm


@test
def norm_numpy_file_exact():
    t = np_tensors()
    f = path("np.safetensors")
    np_save(t, f)
    for threads in (1, 2, 3):
        d = run_json("norm", "--threads", threads, "--group", "layers=layers.*", f)
        allv = [v for a in t.values() for v in np_values(a)]
        assert_bits(d["total_norm"], stfiles.ref_norm(allv), f"total (threads {threads})")
        # the total is dominated by the extreme values: a group without them
        layers = [v for n, a in t.items() if n.startswith("layers.") for v in np_values(a)]
        assert_bits(d["groups"]["layers"], stfiles.ref_norm(layers), f"layers.* (threads {threads})")
        for name, a in t.items():
            assert_bits(float.fromhex(d["tensors_hex"][name]), stfiles.ref_norm(np_values(a)), name)
            if d["tensors"][name] is not None:
                assert_bits(d["tensors"][name], stfiles.ref_norm(np_values(a)), name + " (json number)")


@test
def norm_torch_file_exact_bf16_fp16_fp32_fp64():
    need_torch()
    t = torch_tensors()
    f = path("torch.safetensors")
    torch_save(t, f)
    rc, out, err = run("norm", "--json", f, check=0)
    d = json.loads(out)
    floats = {k: v for k, v in t.items() if v.dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64)}
    allv = [x for v in floats.values() for x in torch_values(v)]
    assert_bits(d["total_norm"], stfiles.ref_norm(allv), "total")
    for name, v in floats.items():
        assert_bits(d["tensors"][name], stfiles.ref_norm(torch_values(v)), name)
    assert set(d["skipped"]) == {"step", "mask"}, d["skipped"]
    assert d["skipped"]["step"] == "I64" and d["skipped"]["mask"] == "BOOL"
    assert "note:" in err and "skipped" in err, err
    assert d["elements"] == sum(v.numel() for v in floats.values())


@test
def norm_json_total_has_17_significant_digits():
    t = np_tensors()
    f = path("np17.safetensors")
    np_save(t, f)
    _, out, _ = run("norm", "--json", f, check=0)
    text = out.split('"total_norm":', 1)[1].split(",", 1)[0].strip()
    ref = stfiles.ref_norm([v for a in t.values() for v in np_values(a)])
    digits = lambda s: s.lower().split("e")[0].replace("-", "").replace(".", "").lstrip("0").rstrip("0")
    assert float(text) == ref, (text, ref)
    assert digits(text) == digits("%.17g" % ref), (text, "%.17g" % ref)
    assert len(digits("%.17g" % ref)) >= 15


@test
def norm_other_orders_exact():
    t = np_tensors(seed=5)
    f = path("ord.safetensors")
    np_save(t, f)
    allv = [v for a in t.values() for v in np_values(a)]
    for ord_, arg in ((1.0, "1"), (math.inf, "inf"), (-math.inf, "-inf"), (0.0, "0")):
        for threads in (1, 2):
            d = run_json("norm", "--ord", arg, "--threads", threads, f)
            assert_bits(float.fromhex(d["total_norm_hex"]) if d["total_norm_hex"] not in ("inf", "nan") else float(d["total_norm_hex"]),
                        stfiles.ref_norm(allv, ord_), f"ord {arg} total")
            for name, a in t.items():
                h = d["tensors_hex"][name]
                got = float(h) if h in ("inf", "nan") else float.fromhex(h)
                assert_bits(got, stfiles.ref_norm(np_values(a), ord_), f"ord {arg} {name}")


@test
def norm_ord_p3_deterministic_and_close():
    rng = np.random.default_rng(9)
    t = {"a": rng.standard_normal(5000).astype(np.float32), "b": rng.standard_normal(300).astype(np.float64)}
    f = path("p3.safetensors")
    np_save(t, f)
    d1 = run_json("norm", "--ord", "3", "--threads", "1", f)
    d2 = run_json("norm", "--ord", "3", "--threads", "2", f)
    assert d1["total_norm_hex"] == d2["total_norm_hex"], "p=3 depends on the thread count"
    allv = [v for a in t.values() for v in np_values(a)]
    ref = float(sum(abs(stfiles.Fraction(v)) ** 3 for v in allv)) ** (1 / 3)
    # documented as not exact: |x|^3 is rounded per element in fp64
    assert abs(d1["total_norm"] - ref) <= 1e-12 * ref, (d1["total_norm"], ref)


@test
def norm_groups_and_multiple_files_and_shards():
    rng = np.random.default_rng(3)
    a = {"l0.experts.0.w": rng.standard_normal(1000).astype(np.float32),
         "l0.attn.w": rng.standard_normal(700).astype(np.float32),
         "shared.w": rng.standard_normal(300).astype(np.float32)}
    b = {"l1.experts.5.w": (rng.standard_normal(900) * 1e-3).astype(np.float64),
         "l1.attn.w": rng.standard_normal(333).astype(np.float16),
         "shared.w": rng.standard_normal(200).astype(np.float32)}  # a second shard
    fa, fb = path("rank0.safetensors"), path("rank1.safetensors")
    np_save(a, fa)
    np_save(b, fb)
    d = run_json("norm", "--group", "expert=*.experts.*", "--group", "attn=*attn*", fa, fb)
    vals = lambda names, src: [v for n in names for v in np_values(src[n])]
    allv = vals(a, a) + vals(b, b)
    assert_bits(d["total_norm"], stfiles.ref_norm(allv), "total over two files")
    assert_bits(d["groups"]["expert"], stfiles.ref_norm(vals(["l0.experts.0.w"], a) + vals(["l1.experts.5.w"], b)), "expert group")
    assert_bits(d["groups"]["attn"], stfiles.ref_norm(vals(["l0.attn.w"], a) + vals(["l1.attn.w"], b)), "attn group")
    assert_bits(d["tensors"]["shared.w"], stfiles.ref_norm(np_values(a["shared.w"]) + np_values(b["shared.w"])), "two shards of one name")
    # text output: the same numbers, a total line
    _, out, _ = run("norm", "--group", "expert=*.experts.*", fa, fb, check=0)
    last = out.strip().splitlines()[-1].split()
    assert last[-1] == "total_norm" and float.fromhex(last[1]) == d["total_norm"], out


@test
def norm_nonfinite():
    t = {"ok": np.array([1.0, 2.0], np.float32), "bad": np.array([1.0, np.inf], np.float32)}
    f = path("inf.safetensors")
    np_save(t, f)
    d = run_json("norm", f)
    assert d["total_norm"] is None and d["total_norm_hex"] == "inf", d
    assert d["tensors"]["ok"] == math.sqrt(5.0)
    for ord_ in ("2", "1", "inf", "3"):
        rc, out, err = run("norm", "--error-if-nonfinite", "--ord", ord_, f)
        assert rc == 2 and out == "" and "'bad'" in err and f in err and len(err.strip().splitlines()) == 1, (ord_, rc, out, err)
    # torch's rule (DESIGN §2): only a non-finite total fails; p = 0 counts
    # Inf (and NaN) as non-zero, p = -inf takes min |x| with Inf as a value
    d = run_json("norm", "--error-if-nonfinite", "--ord", "0", f)
    assert d["total_norm"] == 4.0 and d["tensors"]["bad"] == 2.0, d
    d = run_json("norm", "--error-if-nonfinite", "--ord", "-inf", f)
    assert d["total_norm"] == 1.0, d
    t["bad"][1] = np.nan
    np_save(t, f)
    d = run_json("norm", f)
    assert d["total_norm_hex"] == "nan"
    d = run_json("norm", "--ord", "0", f)
    assert d["total_norm"] == 4.0 and d["tensors"]["bad"] == 2.0, ("a NaN is not zero", d)
    for ord_ in ("inf", "-inf"):
        rc, out, err = run("norm", "--error-if-nonfinite", "--ord", ord_, f)
        assert rc == 2 and "'bad'" in err, (ord_, rc, err)


@test
def norm_misaligned_tensor_data():
    # an odd-sized U8 tensor first puts the F32 data at an odd offset
    x = np.random.default_rng(4).standard_normal(1001).astype(np.float32)
    y = np.array([1.5, -2.25, 3.0], dtype=np.float64)
    ents = [("pad", "U8", (3,), b"\x01\x02\x03"), ("x", "F32", x.shape, x.tobytes()), ("y", "F64", y.shape, y.tobytes())]
    f = path("misaligned.safetensors")
    stfiles.write_raw(f, ents, header_pad=1)
    for ord_ in ("2", "1", "inf", "0", "3"):
        d = run_json("norm", "--ord", ord_, f)
        if ord_ == "3":
            continue
        o = {"2": 2.0, "1": 1.0, "inf": math.inf, "0": 0.0}[ord_]
        assert_bits(d["tensors"]["x"], stfiles.ref_norm(np_values(x), o), "misaligned x ord " + ord_)
        assert_bits(d["total_norm"], stfiles.ref_norm(np_values(x) + np_values(y), o), "misaligned total ord " + ord_)


@test
def norm_quiet_and_text_table():
    t = np_tensors()
    f = path("np_q.safetensors")
    np_save(t, f)
    _, out, _ = run("norm", "-q", f, check=0)
    assert len(out.strip().splitlines()) == 1 and out.split()[-1] == "total_norm", out
    _, out, _ = run("norm", f, check=0)
    names = [line.split()[-1] for line in out.strip().splitlines()[1:-1]]
    assert names == sorted(t, key=str.encode), names


@test
def norm_large_sparse_file_over_4gib():
    # one F32 tensor of 4.25 GiB in a sparse file: values at the start and
    # past the 4 GiB byte offset (and element 2^30); holes read as zeros
    if shutil.disk_usage(Ctx.tmp).free < (1 << 30):
        raise Skip("not enough disk for the sparse file's few blocks")
    n = (1 << 30) + (1 << 26)
    header = json.dumps({"big": {"dtype": "F32", "shape": [n], "data_offsets": [0, 4 * n]}}).encode()
    header += b" " * (-(8 + len(header)) % 8)
    f = path("big.safetensors")
    base = 8 + len(header)
    vals = {0: 1.5, 7: -2.0, (1 << 30) + 3: 3.25, n - 1: 1e-20}
    with open(f, "wb") as fh:
        fh.write(struct.pack("<Q", len(header)) + header)
        fh.truncate(base + 4 * n)
        for i, v in vals.items():
            fh.seek(base + 4 * i)
            fh.write(struct.pack("<f", v))
    try:
        d = run_json("norm", "--threads", "2", f)
        want = stfiles.ref_norm([float(np.float32(v)) for v in vals.values()])
        assert_bits(d["total_norm"], want, "4.25 GiB tensor")
        assert d["elements"] == n
        if xxhash is not None:
            dh = run_json("hash", f)
            h = xxhash.xxh3_128(seed=0)
            u64 = lambda v: struct.pack("<Q", v)
            h.update(u64(3) + b"big" + u64(3) + b"F32" + u64(1) + u64(n) + u64(4 * n))
            with open(f, "rb") as fh:
                fh.seek(base)
                while True:
                    b = fh.read(64 << 20)
                    if not b:
                        break
                    h.update(b)
            assert dh["tensors"]["big"]["hash"] == h.hexdigest(), "hash of the 4.25 GiB tensor"
        # a bar on a terminal (a pty), none in a pipe
        import pty
        master, slave = pty.openpty()
        p = subprocess.run([Ctx.bin, "norm", "-q", f], stdout=subprocess.PIPE, stderr=slave, timeout=300)
        os.close(slave)
        seen = b""
        try:
            while True:
                chunk = os.read(master, 65536)
                if not chunk:
                    break
                seen += chunk
        except OSError:
            pass
        os.close(master)
        assert p.returncode == 0 and b"norm [" in seen and b"GiB" in seen, seen[-300:]
        assert b"norm [" not in p.stdout
        rc, out, err = run("norm", "-q", f, check=0)
        assert "norm [" not in err, "progress bar in a pipe"
    finally:
        os.unlink(f)


@test
def norm_bf16_without_torch_exact():
    # bf16 written byte by byte (round-to-nearest-even from fp32), so bf16 is
    # covered on machines without torch too
    rng = np.random.default_rng(21)
    f32 = (rng.standard_normal(20000) * 3e-3).astype(np.float32)
    b = f32.view(np.uint32).astype(np.uint64)
    bits = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)
    vals = (bits.astype(np.uint32) << 16).view(np.float32)
    f = path("bf16_raw.safetensors")
    stfiles.write_raw(f, [("g", "BF16", (100, 200), bits.tobytes()), ("h", "F32", (3,), f32[:3].tobytes())])
    d = run_json("norm", "--threads", "2", f)
    assert_bits(d["tensors"]["g"], stfiles.ref_norm(np_values(vals)), "bf16")
    assert_bits(d["total_norm"], stfiles.ref_norm(np_values(vals) + np_values(f32[:3])), "bf16 + f32")
