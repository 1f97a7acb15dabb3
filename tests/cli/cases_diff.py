"""`bitexact diff`: crafted safetensors pairs and run records."""
import json
import math
import os
import shutil
import struct
import subprocess

import stfiles
from harness import *  # noqa: F401,F403 - the shared helpers and data
from harness import np, np_save, torch, torch_save, xxhash  # noqa: F401


# ------------------------------------------------------------- diff


def f32_entries(vals, name="w"):
    a = np.array(vals, dtype=np.float32)
    return [(name, "F32", a.shape, a.tobytes())]


def f32_bits(bits):
    return np.array(bits, dtype=np.uint32).view(np.float32)


@test
def diff_identical_files():
    t = np_tensors()
    fa, fb = path("d_a.safetensors"), path("d_b.safetensors")
    np_save(t, fa)
    stfiles.write_raw(fb, raw_entries_np(t), order=list(range(len(t)))[::-1], gap=4)
    rc, out, err = run("diff", fa, fb)
    assert rc == 0 and "result: identical" in out, (rc, out, err)
    d = run_json("diff", fa, fb, check=0)
    assert d["identical"] and all(e["equal"] for e in d["tensors"].values())


@test
def diff_one_ulp_apart():
    x = np.random.default_rng(7).standard_normal(100).astype(np.float32)
    y = x.copy()
    y[42] = np.nextafter(y[42], np.float32(np.inf))
    fa, fb = path("u_a.safetensors"), path("u_b.safetensors")
    np_save({"w": x.reshape(10, 10), "same": x}, fa)
    np_save({"w": y.reshape(10, 10), "same": x}, fb)
    d = run_json("diff", fa, fb, check=1)
    e = d["tensors"]["w"]
    assert not e["equal"] and e["differing"] == 1 and e["max_ulp"] == 1, e
    assert e["first_flat_index"] == 42 and e["first_index"] == [4, 2], e
    assert e["max_abs"] == abs(float(y[42]) - float(x[42])), e
    assert d["tensors"]["same"]["equal"] and d["summary"]["differ"] == 1
    rc, out, _ = run("diff", fa, fb)
    assert rc == 1 and "DIFFER" in out and "[4, 2]" in out and "result: differ" in out, out
    # bf16 (torch) and fp64: one ULP too
    if torch is not None:
        a = torch.tensor([1.0, 2.0, 3.0], dtype=torch.bfloat16)
        b = a.clone()
        b.view(torch.int16)[1] += 1
        torch_save({"b": a}, fa)
        torch_save({"b": b}, fb)
        e = run_json("diff", fa, fb, check=1)["tensors"]["b"]
        assert e["max_ulp"] == 1 and e["first_flat_index"] == 1, e
        assert float.fromhex(e["first_b"]) == float(b[1]) == 2.0 + 2 ** -6, e
    a64 = np.array([1.0, -2.0], np.float64)
    b64 = a64.copy()
    b64[1] = np.nextafter(-2.0, -np.inf)
    b64[0] = np.nextafter(np.nextafter(1.0, 0), 0)
    np_save({"d": a64}, fa)
    np_save({"d": b64}, fb)
    e = run_json("diff", fa, fb, check=1)["tensors"]["d"]
    assert e["differing"] == 2 and e["max_ulp"] == 2 and e["first_flat_index"] == 0, e


@test
def diff_nan_payloads_and_signed_zeros():
    fa, fb = path("n_a.safetensors"), path("n_b.safetensors")
    a = f32_bits([0x7FC00000, 0x00000000, 0x3F800000, 0x7FC00000])
    b = f32_bits([0x7FC00001, 0x80000000, 0x3F800000, 0x3F800000])
    np_save({"w": a}, fa)
    np_save({"w": b}, fb)
    rc, out, err = run("diff", "--json", fa, fb)
    assert rc == 1, (rc, err)
    e = json.loads(out)["tensors"]["w"]
    # both count as differing elements; neither adds to the ULP / abs maxima
    assert e["differing"] == 3 and e["nan_payload"] == 1 and e["signed_zero"] == 1 and e["nan_mismatch"] == 1, e
    assert e["max_ulp"] == 0 and e["max_abs"] == 0 and e["max_rel"] == 0, e
    assert e["first_flat_index"] == 0 and e["first_a"].startswith("nan"), e
    # +0 vs -0 alone
    np_save({"w": f32_bits([0, 0x3F800000])}, fa)
    np_save({"w": f32_bits([0x80000000, 0x3F800000])}, fb)
    e = run_json("diff", fa, fb, check=1)["tensors"]["w"]
    assert e["differing"] == 1 and e["signed_zero"] == 1 and e["max_ulp"] == 0, e
    # same NaN bits: equal
    np_save({"w": f32_bits([0x7FC00123])}, fa)
    np_save({"w": f32_bits([0x7FC00123])}, fb)
    assert run("diff", fa, fb)[0] == 0


@test
def diff_only_in_one_and_mismatches():
    fa, fb = path("m_a.safetensors"), path("m_b.safetensors")
    stfiles.write_raw(fa, [("a_only", "F32", (1,), b"\0" * 4), ("dt", "F16", (2,), b"\0" * 4),
                           ("shape", "F32", (2, 3), b"\0" * 24), ("ok", "I32", (2,), b"\1\0\0\0\2\0\0\0")])
    stfiles.write_raw(fb, [("b_only", "F32", (1,), b"\0" * 4), ("dt", "BF16", (2,), b"\0" * 4),
                           ("shape", "F32", (3, 2), b"\0" * 24), ("ok", "I32", (2,), b"\1\0\0\0\7\0\0\0")])
    d = run_json("diff", fa, fb, check=1)
    assert d["only_in_a"] == ["a_only"] and d["only_in_b"] == ["b_only"], d
    assert sorted(m["name"] for m in d["mismatched"]) == ["dt", "shape"], d["mismatched"]
    e = d["tensors"]["ok"]
    assert e["differing"] == 1 and e["max_ulp"] == 5 and e["max_abs"] == 5 and e["first_flat_index"] == 1, e
    rc, out, _ = run("diff", fa, fb)
    assert "only in A: a_only" in out and "only in B: b_only" in out and "mismatch: dt" in out, out


@test
def diff_every_dtype_bytewise():
    dts = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1, "F8_E4M3FNUZ": 1,
           "F8_E5M2FNUZ": 1, "I16": 2, "U16": 2, "I32": 4, "U32": 4, "C64": 8, "I64": 8, "U64": 8}
    ents_a, ents_b = [], []
    for name, size in dts.items():
        data = bytes((i * 7 + 3) % 120 for i in range(4 * size))
        ents_a.append((name, name, (4,), data))
        ents_b.append((name, name, (4,), data[:-1] + bytes([data[-1] ^ 1])))
    ents_a.append(("F4", "F4", (8,), b"\x12\x34\x56\x78"))
    ents_b.append(("F4", "F4", (8,), b"\x12\x34\x57\x78"))
    fa, fb = path("dt_a.safetensors"), path("dt_b.safetensors")
    stfiles.write_raw(fa, ents_a)
    stfiles.write_raw(fb, ents_b)
    d = run_json("diff", fa, fb, check=1)
    for name in list(dts) + ["F4"]:
        e = d["tensors"][name]
        assert not e["equal"] and e["differing"] == 1, (name, e)
    assert d["tensors"]["F4"]["first_flat_index"] == 2 and d["tensors"]["F4"]["max_ulp"] is None
    assert d["tensors"]["F8_E4M3"]["max_ulp"] == 1, d["tensors"]["F8_E4M3"]
    assert run("diff", fa, fa)[0] == 0
    assert run("norm", fa, check=0)[2].count("note:") == 1  # no float tensor: skipped, norm 0


@test
def diff_run_records():
    def rec(step, loss, gn):
        return json.dumps({"step": step, "loss": loss.hex(), "grad_norm": gn.hex(), "lr": "0x1.0p-10"})
    losses = [3.0 / (s + 1) for s in range(60)]
    a = [rec(s, losses[s], 1.0 + s / 7) for s in range(60)]
    b = list(a)
    b[37] = rec(37, math.nextafter(losses[37], 1.0), 1.0 + 37 / 7)
    b[40] = rec(40, losses[40], 5.0)
    fa, fb = path("run_a.jsonl"), path("run_b.jsonl")
    open(fa, "w").write("\n".join(a) + "\n")
    open(fb, "w").write("\n".join(b) + "\n")
    assert run("diff", fa, fa)[0] == 0
    rc, out, err = run("diff", fa, fb)
    assert rc == 1 and "first divergence: step 37" in out and "1 ulp" in out, (out, err)
    d = run_json("diff", fa, fb, check=1)
    fd = d["first_divergence"]
    assert fd["step"] == 37 and fd["fields"]["loss"]["ulp"] == 1 and fd["fields"]["grad_norm"]["equal"], fd
    assert d["differing_steps"] == 2 and d["fields"]["grad_norm"]["first_step"] == 40, d
    # steps missing from B; reordered lines are matched by step
    open(fb, "w").write("\n".join(reversed(a[:50])) + "\n")
    d = run_json("diff", fa, fb, check=1)
    assert d["only_in_a"] == 10 and d["differing_steps"] == 0 and d["first_divergence"] is None, d
    # bad records: one line, exit 2
    open(fb, "w").write(a[0] + "\n{not json\n")
    rc, out, err = run("diff", fa, fb)
    assert rc == 2 and out == "" and fb in err and "line 2" in err and len(err.strip().splitlines()) == 1, (rc, out, err)
    open(fb, "w").write(a[0] + "\n" + a[0] + "\n")
    rc, out, err = run("diff", fa, fb)
    assert rc == 2 and "twice" in err, err
