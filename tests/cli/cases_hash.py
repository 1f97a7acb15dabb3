"""`bitexact hash`: the documented definition, recomputed with xxhash."""
import json
import math
import os
import shutil
import struct
import subprocess

import stfiles
from harness import *  # noqa: F401,F403 - the shared helpers and data
from harness import np, np_save, torch, torch_save, xxhash  # noqa: F401


# ------------------------------------------------------------- hash


@test
def hash_matches_definition_and_is_order_independent():
    need_xxhash()
    t = np_tensors(seed=11)
    ents = raw_entries_np(t)
    files = []
    f0 = path("h_np.safetensors")
    np_save(t, f0)
    files.append(f0)
    for k, (order, gap, lead, meta) in enumerate([(None, 0, 0, None), (list(range(len(ents)))[::-1], 0, 0, None),
                                                  ([3, 1, 4, 0, 5, 9, 2, 6, 8, 7], 13, 5, {"framework": "x"})]):
        fk = path(f"h_raw{k}.safetensors")
        stfiles.write_raw(fk, ents, order=order, gap=gap, lead=lead, tail=7, metadata=meta, header_pad=k)
        files.append(fk)
    # split into two files: the checkpoint hash must not change
    fa, fb = path("h_part_a.safetensors"), path("h_part_b.safetensors")
    stfiles.write_raw(fa, ents[:4])
    stfiles.write_raw(fb, ents[4:])
    digests = {name: stfiles.tensor_hash(xxhash, name, dt, shape, data) for name, dt, shape, data in ents}
    want_ckpt = stfiles.checkpoint_hash(xxhash, digests)
    outs = []
    for f in files:
        d = run_json("hash", "--threads", "2", f)
        assert d["checkpoint"] == want_ckpt, (f, d["checkpoint"], want_ckpt)
        for name, e in d["tensors"].items():
            assert e["hash"] == digests[name].hex(), (f, name)
        outs.append(run("hash", f, check=0)[1])
    assert len(set(outs)) == 1, "text output depends on the file's layout"
    d = run_json("hash", fb, fa)
    assert d["checkpoint"] == want_ckpt, "checkpoint split over two files"
    # the text form ends with the checkpoint line
    last = outs[0].strip().splitlines()[-1]
    assert last.startswith(want_ckpt) and "checkpoint" in last, last


@test
def hash_torch_file_all_dtypes():
    need_torch()
    need_xxhash()
    t = torch_tensors()
    f = path("h_torch.safetensors")
    torch_save(t, f)
    d = run_json("hash", f)
    st_names = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16",
                torch.float64: "F64", torch.int64: "I64", torch.bool: "BOOL"}
    digests = {}
    for name, v in t.items():
        data = v.contiguous().view(torch.uint8).numpy().tobytes() if v.dtype != torch.bool else v.numpy().tobytes()
        digests[name] = stfiles.tensor_hash(xxhash, name, st_names[v.dtype], list(v.shape), data)
        assert d["tensors"][name]["hash"] == digests[name].hex(), name
        assert d["tensors"][name]["dtype"] == st_names[v.dtype]
    assert d["checkpoint"] == stfiles.checkpoint_hash(xxhash, digests)


@test
def hash_sees_every_field():
    base = [("w", "F16", (2, 3), bytes(range(12)))]
    variants = {
        "same": [("w", "F16", (2, 3), bytes(range(12)))],
        "dtype": [("w", "BF16", (2, 3), bytes(range(12)))],
        "shape": [("w", "F16", (3, 2), bytes(range(12)))],
        "name": [("v", "F16", (2, 3), bytes(range(12)))],
        "bit": [("w", "F16", (2, 3), bytes([0] + list(range(1, 11)) + [11 ^ 0x80]))],
    }
    f = path("hv_base.safetensors")
    stfiles.write_raw(f, base)
    h0 = run_json("hash", f)["checkpoint"]
    for k, ents in variants.items():
        fk = path(f"hv_{k}.safetensors")
        stfiles.write_raw(fk, ents, gap=3)
        h = run_json("hash", fk)["checkpoint"]
        assert (h == h0) == (k == "same"), k


@test
def hash_duplicate_name_across_files_is_an_error():
    f1, f2 = path("hd1.safetensors"), path("hd2.safetensors")
    stfiles.write_raw(f1, [("w", "F32", (1,), b"\0\0\0\0")])
    stfiles.write_raw(f2, [("w", "F32", (1,), b"\0\0\0\0")])
    rc, out, err = run("hash", f1, f2)
    assert rc == 2 and out == "" and "'w'" in err and len(err.strip().splitlines()) == 1, (rc, out, err)
