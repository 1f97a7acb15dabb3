"""Bad input: exit 2, one line naming the file (and tensor), nothing on stdout."""
import json
import math
import os
import shutil
import struct
import subprocess

import stfiles
from harness import *  # noqa: F401,F403 - the shared helpers and data
from harness import np, np_save, torch, torch_save, xxhash  # noqa: F401


# ------------------------------------------------------------- bad input


def bad_file(name, content):
    f = path(name)
    with open(f, "wb") as fh:
        fh.write(content)
    return f


def header_file(name, header, data=b""):
    hb = header.encode() if isinstance(header, str) else header
    return bad_file(name, struct.pack("<Q", len(hb)) + hb + data)


def expect_error(f, *needles, commands=("norm", "hash", "diff")):
    for cmd in commands:
        args = (cmd, f, f) if cmd == "diff" else (cmd, f)
        rc, out, err = run(*args, "--safetensors" if cmd == "diff" else "--no-progress")
        lines = err.strip().splitlines()
        assert rc == 2, (cmd, f, rc, out, err)
        assert out == "", (cmd, "partial output", out)
        assert len(lines) == 1 and lines[0].startswith("bitexact: "), (cmd, err)
        assert f in lines[0], (cmd, "file not named", err)
        for n in needles:
            assert n in lines[0], (cmd, n, err)


def valid_entry(off=0, n=2):
    return {"dtype": "F32", "shape": [n], "data_offsets": [off, off + 4 * n]}


@test
def bad_missing_file():
    expect_error(path("no_such_file.safetensors"), "No such file")


@test
def bad_empty_file():
    expect_error(bad_file("empty.safetensors", b""), "empty")


@test
def bad_short_file():
    expect_error(bad_file("short.safetensors", b"\x05\x00\x00"), "too short")


@test
def bad_header_length_beyond_file():
    expect_error(bad_file("hdrlen.safetensors", struct.pack("<Q", 1000) + b'{"a": 1}'), "header length 1000")


@test
def bad_header_length_huge():
    expect_error(bad_file("hdrhuge.safetensors", struct.pack("<Q", 2 ** 63 + 5) + b"{}"), "header length")


@test
def bad_invalid_json():
    expect_error(header_file("json.safetensors", '{"w": {"dtype": "F32", "shape": [2], '), "invalid JSON")
    expect_error(header_file("json2.safetensors", '{"w": nope}'), "invalid JSON")


@test
def bad_header_not_an_object():
    expect_error(header_file("arr.safetensors", '["w"]'), "{")
    expect_error(header_file("num.safetensors", '{"w": 3}', b"\0" * 8), "'w'")


@test
def bad_offsets_out_of_range():
    h = json.dumps({"w": valid_entry(0, 2), "v": valid_entry(8, 4)})
    expect_error(header_file("range.safetensors", h, b"\0" * 12), "'v'", "beyond")


@test
def bad_offsets_negative_or_reversed():
    h = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}})
    expect_error(header_file("neg.safetensors", h, b"\0" * 8), "'w'")
    h = json.dumps({"w": {"dtype": "F32", "shape": [0], "data_offsets": [8, 4]}})
    expect_error(header_file("rev.safetensors", h, b"\0" * 8), "'w'")


@test
def bad_offsets_overlapping():
    h = json.dumps({"w": valid_entry(0, 2), "v": valid_entry(4, 2)})
    expect_error(header_file("overlap.safetensors", h, b"\0" * 12), "overlap", "'w'", "'v'")


@test
def bad_size_not_dtype_times_shape():
    h = json.dumps({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})
    expect_error(header_file("size.safetensors", h, b"\0" * 8), "'w'", "F32")
    h = json.dumps({"w": {"dtype": "F64", "shape": [2 ** 62, 8], "data_offsets": [0, 8]}})
    expect_error(header_file("overflow.safetensors", h, b"\0" * 8), "'w'")


@test
def bad_unknown_dtype():
    h = json.dumps({"w": {"dtype": "F17", "shape": [1], "data_offsets": [0, 4]}})
    expect_error(header_file("dtype.safetensors", h, b"\0" * 4), "'w'", "F17")


@test
def bad_duplicate_names():
    h = '{"w": %s, "w": %s}' % (json.dumps(valid_entry(0, 1)), json.dumps(valid_entry(4, 1)))
    expect_error(header_file("dup.safetensors", h, b"\0" * 8), "duplicate", '"w"')


@test
def bad_truncated_file():
    t = np_tensors()
    f = path("trunc.safetensors")
    np_save(t, f)
    data = open(f, "rb").read()
    expect_error(bad_file("trunc_data.safetensors", data[:-100]), "truncated")
    n = struct.unpack("<Q", data[:8])[0]
    expect_error(bad_file("trunc_header.safetensors", data[: 8 + n // 2]), "header length")


@test
def bad_directory_and_metadata():
    d = path("a_directory.safetensors")
    os.makedirs(d, exist_ok=True)
    expect_error(d, "not a regular file")
    h = json.dumps({"__metadata__": {"k": 3}, "w": valid_entry(0, 1)})
    expect_error(header_file("meta.safetensors", h, b"\0" * 4), "__metadata__")


@test
def bad_one_good_one_bad_file_prints_nothing():
    good = path("good.safetensors")
    np_save({"w": np.ones(4, np.float32)}, good)
    bad = bad_file("bad2.safetensors", b"\x00")
    rc, out, err = run("norm", good, bad)
    assert rc == 2 and out == "" and bad in err, (rc, out, err)


@test
def bad_usage_and_output_errors():
    assert run("frobnicate")[0] == 2
    assert run("norm")[0] == 2
    assert run("norm", "--ord", "-3", path("x"))[0] == 2
    assert run("norm", "--threads", "abc", path("x"))[0] == 2
    assert run("diff", path("x"))[0] == 2
    rc, out, _ = run("--help", check=0)
    assert "XXH3-128" in out and "u64(len(name))" in out and "+0 vs -0" in out
    good = path("good_out.safetensors")
    np_save({"w": np.ones(4, np.float32)}, good)
    if os.path.exists("/dev/full"):
        with open("/dev/full", "w") as full:
            rc, _, err = run("norm", good, stdout=full)
        assert rc == 2 and "standard output" in err, (rc, err)
