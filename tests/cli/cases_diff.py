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


# ------------------------------------------------------------- diff --trace
# Traces written here by hand from the format of docs/trace.md (json and
# the xxhash package), not by bitexact's own writer.


def trace_entry(step, phase, module, what, slc, vals):
    a = np.ascontiguousarray(vals, dtype=np.float32).reshape(-1)
    n, raw = a.size, a.tobytes()
    nb = min(16, n)
    blocks = "".join(xxhash.xxh3_64_hexdigest(raw[(j * n // nb) * 4:((j + 1) * n // nb) * 4]) for j in range(nb))
    return json.dumps({"step": step, "phase": phase, "module": module, "what": what, "slice": slc,
                       "dtype": "F32", "shape": [n], "hash": xxhash.xxh3_64_hexdigest(raw),
                       "blocks": blocks, "head": [float(v).hex() for v in a[:8]]})


def write_trace(name, lines, model="m:1"):
    p = path(name)
    with open(p, "w") as f:
        f.write(json.dumps({"bitexact_trace": 1, "blocks": 16, "hash": "xxh3-64", "head": 8,
                            "model": model, "producer": "cases_diff"}, sort_keys=True) + "\n")
        for line in lines:
            f.write(line + "\n")
    return p


@test
def diff_trace_first_common_difference_and_one_side():
    """A has an entry B lacks before the differing one; the first difference
    is the common one (element 40 of 64: its part and the --dump key), the
    entries only on one side are counted and named, exit 1."""
    need_xxhash()
    x = np.arange(64, dtype=np.float32) / 7
    y = x.copy()
    y[40] = np.nextafter(y[40], np.float32(np.inf))
    emb = trace_entry(0, "forward", "model.embed", "output", 0, x[:4])
    a = write_trace("ta.trace", [emb, trace_entry(0, "forward", "model.rotary_emb", "output", None, x[:3]),
                                 trace_entry(0, "forward", "model.norm", "output", 0, x),
                                 trace_entry(0, "backward", "w", "grad", None, x[:2])])
    b = write_trace("tb.trace", [emb, trace_entry(0, "forward", "model.norm", "output", 0, y),
                                 trace_entry(0, "forward", "model.qkv", "output", 1, x[:5]),
                                 trace_entry(0, "forward", "model.qkv", "output", 2, x[:5]),
                                 trace_entry(0, "backward", "w", "grad", None, x[:2])])
    rc, out, err = run("diff", "--trace", a, b)
    lines = out.splitlines()
    assert rc == 1 and err == "", (rc, out, err)
    assert lines[0] == "first difference: step 0, forward, model.norm, output, sequence 0 (F32, 1-d)", out
    assert lines[1] == "  first differing element in [40, 44) (beyond the first values kept)", out
    assert lines[2] == ("  rerun both with --dump '0/forward/model.norm/output/0' and bitexact diff "
                        "the two .dump.safetensors files"), out
    assert lines[3] == "1 of 3 common entries differ; in model.norm (1)", out
    assert lines[4] == f"1 entries only in {a} (first: step 0, forward, model.rotary_emb, output, whole)", out
    assert lines[5] == f"2 entries only in {b} (first: step 0, forward, model.qkv, output, sequence 1)", out
    j = run_json("diff", "--trace", a, b, check=1)
    f = j["first"]
    assert (j["differ"], j["only_in_a"], j["only_in_b"]) == (1, 1, 2), j
    assert (f["module"], f["slice"], f["elements"], f["element"], f["dump_key"]) == \
        ("model.norm", 0, [40, 44], None, "0/forward/model.norm/output/0"), f
    assert j["first_only_in_a"] == {"step": 0, "phase": "forward", "module": "model.rotary_emb",
                                    "what": "output", "slice": None}, j
    assert j["first_only_in_b"]["module"] == "model.qkv" and j["first_only_in_b"]["slice"] == 1, j
    # the same entries, only B's extra ones: no common difference, still exit 1
    c = write_trace("tc.trace", [emb])
    rc, out, err = run("diff", "--trace", c, b)
    assert rc == 1 and out.startswith("first difference: none among the 1 common entries; "), out
    j = run_json("diff", "--trace", c, b, check=1)
    assert j["first"] is None and j["differ"] == 0 and j["only_in_b"] == 4, j
    rc, out, err = run("diff", "--trace", c, c)
    assert rc == 0 and out == "identical: 1 entries, model m:1\n", out


@test
def diff_trace_bad_files():
    """Truncated, duplicate keys, other models, another version: one line, exit 2."""
    need_xxhash()
    e = trace_entry(0, "forward", "m", "output", 0, [1.0, 2.0])
    good = write_trace("good.trace", [e])
    cases = {
        "trunc.trace": open(good).read()[:-1],
        "dup.trace": open(write_trace("dup0.trace", [e, e])).read(),
        "other.trace": open(write_trace("other0.trace", [e], model="m:2")).read(),
        "v2.trace": open(good).read().replace('"bitexact_trace": 1', '"bitexact_trace": 2'),
        "badhead.trace": open(good).read().replace('"0x1.0000000000000p+0"', '"one"'),
    }
    for name, text in cases.items():
        p = path(name)
        with open(p, "w") as f:
            f.write(text)
        rc, out, err = run("diff", "--trace", good, p)
        assert rc == 2 and out == "" and err.count("\n") == 1 and err.startswith("bitexact: "), (name, rc, out, err)
