"""`bitexact train`: config.json parsing and checks, the token data readers and
their order, the layout checks, checkpoints (atomic, deterministic, validated
on resume), the run record and resuming bit for bit.

Bad input must give exit 2, one line on stderr, nothing on stdout and no file
written. The data order is recomputed here from docs/train_cli.md's
definition (splitmix64 counters, Fisher-Yates) and compared with
`bitexact train --dry-run --json`, which builds no model. The cases named
train_run_* build the model and train a few steps of the tiny config."""
import json
import os
import struct

from harness import *  # noqa: F401,F403 - the shared helpers and data
from harness import np, xxhash  # noqa: F401

M64 = (1 << 64) - 1
FAST = ("--seq-len", "16", "--global-batch", "4")


def tpath(name):
    return path("train_" + name)


def write(name, content):
    f = tpath(name)
    with open(f, "wb" if isinstance(content, bytes) else "w") as fh:
        fh.write(content)
    return f


def expect_train_error(*args, needles=(), outputs=True):
    """Runs `bitexact train ARGS` expecting exit 2 and one line; with
    outputs, also asks for a record, a checkpoint and a gradient dump and
    checks that none was written."""
    rec, ck, dg = tpath("err.jsonl"), tpath("err_ckpt"), tpath("err_grads.safetensors")
    for f in (rec, dg):
        if os.path.exists(f):
            os.remove(f)
    extra = ("--record", rec, "--save", ck, "--dump-grads", dg) if outputs else ()
    rc, out, err = run("train", *args, *extra)
    lines = err.strip().splitlines()
    assert rc == 2, (args, rc, out, err)
    assert out == "", ("partial output", out)
    assert len(lines) == 1 and lines[0].startswith("bitexact: "), (args, err)
    for n in needles:
        assert n in lines[0], (args, n, err)
    if outputs:
        assert not os.path.exists(rec) and not os.path.exists(dg), "a file was written"
        assert not os.path.exists(ck), "a checkpoint was written"
        left = [f for f in os.listdir(Ctx.tmp) if f.startswith("train_err_ckpt.tmp")]
        assert not left, left
    return lines[0]


# ------------------------------------------------------------- config.json

TINY = {
    "model_type": "glm4_moe", "vocab_size": 128, "hidden_size": 32, "intermediate_size": 64,
    "moe_intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 64,
    "attention_bias": True, "partial_rotary_factor": 0.5, "rope_theta": 10000.0,
    "first_k_dense_replace": 1, "n_routed_experts": 8, "num_experts_per_tok": 2,
    "n_shared_experts": 1, "n_group": 2, "topk_group": 1, "norm_topk_prob": True,
    "routed_scaling_factor": 1.0, "hidden_act": "silu", "tie_word_embeddings": False,
    "rope_scaling": None, "eos_token_id": [1, 2], "num_nextn_predict_layers": 1,
}


def config_file(name, **changes):
    c = dict(TINY)
    for k, v in changes.items():
        if v is KeyError:
            c.pop(k, None)
        else:
            c[k] = v
    return write(name + ".json", json.dumps(c))


def dry(*args):
    rc, out, err = run("train", "--dry-run", *args, check=0)
    return json.loads(out)


@test
def train_config_valid_and_param_count():
    d = dry("--config", config_file("ok"), *FAST)
    H, V, I, Im, E = 32, 128, 64, 16, 8
    attn = 2 * H + (4 * 8 + 2 * 2 * 8) * H + H * 4 * 8 + (4 * 8 + 2 * 2 * 8)
    dense = attn + 3 * H * I
    moe = attn + E * (H + 1) + 3 * H * Im * (E + 1)
    assert d["params"] == 2 * V * H + H + dense + moe, d


@test
def train_config_rope_forms():
    # transformers 5: rope_parameters only; 4.x: top level; both agreeing
    rp = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
    dry("--config", config_file("rp", rope_theta=KeyError, partial_rotary_factor=KeyError,
                                rope_parameters=rp), *FAST)
    dry("--config", config_file("rp2", rope_parameters=rp), *FAST)
    expect_train_error("--config", config_file("rp3", rope_theta=5e5, rope_parameters=rp),
                       needles=("rope_theta",))
    expect_train_error("--config", config_file("rs", rope_scaling={"rope_type": "yarn", "factor": 4.0}),
                       needles=("rope_scaling",))


BAD_CONFIGS = [
    ("heads_kv", {"num_key_value_heads": 3}, ("num_attention_heads", "num_key_value_heads")),
    ("kv_gt_heads", {"num_key_value_heads": 8}, ("num_key_value_heads", "8")),
    ("experts_group", {"n_group": 3}, ("n_routed_experts", "n_group")),
    ("topk_group", {"topk_group": 3}, ("topk_group", "3")),
    ("topk_too_many", {"num_experts_per_tok": 5}, ("num_experts_per_tok", "5")),
    ("act", {"hidden_act": "gelu"}, ("hidden_act", "gelu")),
    ("tied", {"tie_word_embeddings": True}, ("tie_word_embeddings",)),
    ("zero_hidden", {"hidden_size": 0}, ("hidden_size", "0")),
    ("huge_vocab", {"vocab_size": 1 << 30}, ("vocab_size",)),
    ("neg_layers", {"num_hidden_layers": -1}, ("num_hidden_layers",)),
    ("dense_gt_layers", {"first_k_dense_replace": 3}, ("first_k_dense_replace", "3")),
    ("string_size", {"hidden_size": "32"}, ("hidden_size", "integer")),
    ("bool_type", {"attention_bias": 1}, ("attention_bias",)),
    ("rotary_odd", {"partial_rotary_factor": 0.375}, ("partial_rotary_factor",)),
    ("rotary_zero", {"partial_rotary_factor": 0.0}, ("partial_rotary_factor",)),
    ("eps", {"rms_norm_eps": -1.0}, ("rms_norm_eps",)),
    ("theta", {"rope_theta": 0.5}, ("rope_theta",)),
    ("dropout", {"attention_dropout": 0.1}, ("attention_dropout",)),
    ("model_type", {"model_type": "llama"}, ("model_type",)),
    ("scaling", {"routed_scaling_factor": 0.0}, ("routed_scaling_factor",)),
]


@test
def train_config_range_errors():
    for name, change, needles in BAD_CONFIGS:
        f = config_file("bad_" + name, **change)
        line = expect_train_error("--config", f, *FAST, needles=needles)
        assert f in line, (name, line)


@test
def train_config_defaults_are_full_size():
    # absent fields take Glm4MoeConfig's defaults: the 100B-parameter model
    f = write("defaults.json", '{"model_type": "glm4_moe", "head_dim": 128}')
    expect_train_error("--config", f, needles=("parameters", "limit"))


@test
def train_config_bad_json():
    expect_train_error("--config", write("badjson.json", '{"vocab_size": 12,'), needles=("invalid JSON",))
    expect_train_error("--config", write("array.json", "[1, 2]"), needles=("object",))
    expect_train_error("--config", write("dup.json", '{"vocab_size": 12, "vocab_size": 13}'))
    expect_train_error("--config", tpath("missing.json"), needles=("missing.json",))


# ------------------------------------------------------------- token data


def npy_bytes(arr, version=(1, 0), descr=None, fortran=False, shape=None, extra=b"", cut=0):
    descr = descr or arr.dtype.str
    shape = arr.shape if shape is None else shape
    h = "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }" % (descr, fortran, repr(tuple(shape)))
    pre = 10 if version[0] == 1 else 12
    pad = (64 - (pre + len(h) + 1) % 64) % 64
    h = (h + " " * pad + "\n").encode()
    lenb = struct.pack("<H", len(h)) if version[0] == 1 else struct.pack("<I", len(h))
    data = b"\x93NUMPY" + bytes(version) + lenb + h + arr.tobytes() + extra
    return data[:len(data) - cut] if cut else data


@test
def train_data_npy_accepted():
    rng = np.random.default_rng(3)
    for dt in ("<i2", "<u2", "<i4", "<u4", "<i8"):
        a = rng.integers(0, 256, 200, dtype=np.int64).astype(dt)
        f = tpath("ok_%s.npy" % dt[1:])
        np.save(f, a)
        d = dry("--data", f, "--seq-len", "16", "--global-batch", "2", "--steps", "2")
        assert d["data"]["kind"] == "npy" and d["data"]["tokens"] == 200, d
        assert d["data"]["sequences"] == (200 - 1) // 16
    for v in ((2, 0), (3, 0)):
        f = write("v%d.npy" % v[0], npy_bytes(np.arange(100, dtype="<i4"), version=v))
        assert dry("--data", f, "--seq-len", "8", "--global-batch", "2")["data"]["tokens"] == 100


@test
def train_data_npy_errors():
    a = np.arange(100, dtype="<i4")
    cases = [
        ("magic", b"\x93NUMPX" + npy_bytes(a)[6:], ("magic",)),
        ("version", npy_bytes(a, version=(4, 0)), ("version 4",)),
        ("float", npy_bytes(a.astype("<f4")), ("dtype", "<f4")),
        ("bigendian", npy_bytes(a.astype(">i4")), (">i4",)),
        ("u8", npy_bytes(a.astype("<u8")), ("<u8",)),
        ("fortran", npy_bytes(a, fortran=True), ("fortran_order",)),
        ("2d", npy_bytes(a.reshape(10, 10)), ("1-D",)),
        ("scalar", npy_bytes(np.array(5, dtype="<i4")), ("1-D",)),
        ("truncated", npy_bytes(a, cut=7), ("truncated",)),
        ("extra", npy_bytes(a, extra=b"\0\0\0\0"), ("after its array",)),
        ("hdrlen", b"\x93NUMPY\x01\x00\xff\xff{", ("header length",)),
        ("nodict", b"\x93NUMPY\x01\x00\x04\x00abc\n", ("dict",)),
        ("bigshape", npy_bytes(a, shape=(2 ** 62,)), ("truncated",)),
        ("hugeint", npy_bytes(a, shape=(10 ** 30,)), ("shape",)),
    ]
    for name, content, needles in cases:
        f = write("bad_%s.npy" % name, content)
        line = expect_train_error("--data", f, *FAST, needles=needles)
        assert f in line, (name, line)


@test
def train_data_id_range():
    a = np.arange(300, dtype="<i4") % 128
    a[77] = 128  # == vocab_size of TINY
    f = tpath("oob.npy")
    np.save(f, a)
    expect_train_error("--config", config_file("vocab"), "--data", f, *FAST,
                       needles=("token id 128", "index 77"))
    b = np.arange(300, dtype="<i2") % 100
    b[5] = -3
    f = tpath("neg.npy")
    np.save(f, b)
    expect_train_error("--config", config_file("vocab2"), "--data", f, *FAST, needles=("token id -3",))


@test
def train_data_bin():
    a = (np.arange(1001) % 128).astype("<u2")
    f = write("ok.bin", a.tobytes())
    d = dry("--config", config_file("bin"), "--data", f, *FAST)
    assert d["data"]["kind"] == "bin" and d["data"]["tokens"] == 1001, d
    expect_train_error("--data", write("odd.bin", a.tobytes() + b"\0"), *FAST, needles=("odd size",))
    expect_train_error("--data", write("tokens.dat", a.tobytes()), *FAST, needles=(".bin",))
    expect_train_error("--data", write("empty.bin", b""), *FAST, needles=("empty",))
    expect_train_error("--data", write("short.bin", a[:16].tobytes()), *FAST, needles=("fewer",))
    expect_train_error("--data", tpath("nonexistent.bin"), *FAST, needles=("nonexistent.bin",))
    big = np.array([0, 1, 60000], dtype="<u2")
    expect_train_error("--config", config_file("binv"), "--data",
                       write("oob.bin", np.tile(big, 20).tobytes()), *FAST, needles=("60000",))


# ------------------------------------------------------------- data order


def mix(z):
    z = (z + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def rand(seed, d, i):
    return mix(mix(mix(seed) ^ d) ^ i)


def rand3(seed, d, a, b):
    return mix(rand(seed, d, a) ^ b)


def perm(seed, epoch, n):
    p = list(range(n))
    for i in range(n - 1, 0, -1):
        j = (rand3(seed, 4, epoch, i) * (i + 1)) >> 64
        p[i], p[j] = p[j], p[i]
    return p


def order(nseq, B, steps, seed=0, shuffle=False, first=0):
    out = []
    for s in range(first, steps):
        row = []
        for b in range(B):
            g = s * B + b
            row.append(perm(seed, g // nseq, nseq)[g % nseq] if shuffle else g % nseq)
        out.append(row)
    return out


@test
def train_data_order():
    a = (np.arange(16 * 7 + 5) % 128).astype("<u2")  # 7 whole sequences of 16 + 1
    f = write("order.bin", a.tobytes())
    cfg = config_file("order")
    for B, steps in ((4, 5), (3, 6), (7, 2), (10, 3)):
        d = dry("--config", cfg, "--data", f, "--seq-len", "16", "--global-batch", str(B),
                "--steps", str(steps))
        assert d["data"]["sequences"] == 7
        assert d["order"] == order(7, B, steps), (B, steps, d["order"])
        for seed in (0, 1, 12345678901234567):
            d = dry("--config", cfg, "--data", f, "--seq-len", "16", "--global-batch", str(B),
                    "--steps", str(steps), "--shuffle", "--seed", str(seed))
            assert d["order"] == order(7, B, steps, seed, True), (B, steps, seed, d["order"])
            for row_epoch in range(2):
                seqs = [x for r in d["order"] for x in r][7 * row_epoch:7 * row_epoch + 7]
                if len(seqs) == 7:
                    assert sorted(seqs) == list(range(7))  # each epoch a permutation


@test
def train_synthetic_entropy():
    d = dry(*FAST)
    assert d["data"]["kind"] == "synthetic" and d["data"]["tokens"] == (1 << 20) + 1, d
    assert d["data"]["entropy_bits"] == 1.984375, d
    import math
    assert abs(float.fromhex(d["data"]["entropy_rate"]) - 1.984375 * math.log(2)) < 1e-15
    tiny = dry("--config", config_file("v3", vocab_size=3), *FAST)  # K = 2 offsets: 1 bit
    assert tiny["data"]["entropy_bits"] == 1.0, tiny


# ------------------------------------------------------------- layout, flags


@test
def train_layout_errors():
    expect_train_error("--global-batch", "6", "--micro-batches", "4", needles=("--micro-batches 4", "6"))
    expect_train_error("--ep", "2", needles=("--ep 2 does not divide the 1 rank",))
    expect_train_error("--mode", "fast", needles=("--mode", "fast"))
    expect_train_error("--steps", "-1", needles=("--steps",))
    expect_train_error("--lr", "nan", needles=("--lr",))
    expect_train_error("--global-batch", "0", needles=("--global-batch",))
    expect_train_error("--bogus", needles=("--bogus",))
    expect_train_error("--steps", needles=("needs a value",), outputs=False)
    expect_train_error("--config", config_file("maxpos"), "--seq-len", "65", needles=("max_position_embeddings",))
    d = tpath("foreign_dir")
    os.makedirs(d, exist_ok=True)
    write("foreign_dir/notes.txt", "mine")
    expect_train_error("--save", d, needles=("notes.txt",), outputs=False)
    expect_train_error("--save", tpath("no/such/dir"), needles=("parent",), outputs=False)
    expect_train_error("--record", tpath("no/such/r.jsonl"), needles=("--record",), outputs=False)


# ------------------------------------------------------------- runs (need the model)


def train_run(*args):
    rc, out, err = run("train", *FAST, "--json", *args, check=0)
    return json.loads(out)


def records(f):
    with open(f) as fh:
        return [json.loads(l) for l in fh if l.strip()]


@test
def train_run_record_and_resume():
    ra, rb, ck = tpath("run_a.jsonl"), tpath("run_b.jsonl"), tpath("run_ckpt")
    summary = train_run("--steps", "4", "--record", ra)
    # the summary's in-process step times (benchmarks), positive; never in the records
    assert summary["first_step_seconds"] > 0 and summary["step_seconds"] > 0, summary
    A = records(ra)
    assert all("seconds" not in k for r in A for k in r)
    assert [r["step"] for r in A] == [0, 1, 2, 3]
    for r in A:
        for k in ("loss", "grad_norm", "grad_norm_dense", "grad_norm_expert", "clip_coef", "lr"):
            float.fromhex(r[k])
        assert r["tokens"] == 4 * 16 and r["loss_hash"].startswith("xxh3:")
        n, d, e = (float.fromhex(r[k]) for k in ("grad_norm", "grad_norm_dense", "grad_norm_expert"))
        assert abs(n * n - d * d - e * e) <= 1e-12 * n * n
    train_run("--steps", "2", "--save", ck)
    train_run("--steps", "4", "--resume", ck, "--record", rb)
    B = records(rb)
    assert [r["step"] for r in B] == [2, 3]
    assert B == A[2:], (A[2:], B)
    rc, out, err = run("diff", ra, rb)
    assert rc == 1 and "0 differ" in out, out  # steps 0, 1 only in A; the rest identical


@test
def train_run_grid_history():
    """The one-pass step (docs/train_model.md): step 0 takes two passes (no
    history), the others one; the checkpoint carries the history
    (trainer_state format 2), so a resumed run continues in one pass, bit
    for bit; a format-1 checkpoint (no history) resumes with two passes on
    its first step; --grid-history off takes two passes every step, on
    the observed grid; a bad history is refused, naming the entry."""
    ra, ck = tpath("gh_a.jsonl"), tpath("gh_ckpt")
    train_run("--steps", "4", "--record", ra)
    A = records(ra)
    assert [r["passes"] for r in A] == [2, 1, 1, 1], A
    assert all(r["record_format"] == 2 for r in A), A
    train_run("--steps", "2", "--save", ck)
    with open(os.path.join(ck, "trainer_state.json")) as f:
        st = json.load(f)
    assert st["format_version"] == 2, st
    gh = st["grid_history"]
    rc, out, err = run("hash", os.path.join(ck, "model.safetensors"), "--json")
    assert rc == 0, err
    trainable = {n for n in json.loads(out)["tensors"] if not n.endswith("e_score_correction_bias")}
    assert set(gh) == trainable | {"loss"}, sorted(set(gh) ^ (trainable | {"loss"}))
    assert all(isinstance(v, int) and -149 <= v <= 128 for v in gh.values()), gh
    # format 1 (the two-pass trainer's checkpoints): no history, two passes first, same bits
    import shutil
    old = tpath("gh_v1")
    shutil.rmtree(old, ignore_errors=True)
    shutil.copytree(ck, old)
    st1 = dict(st)
    st1["format_version"] = 1
    del st1["grid_history"]
    with open(os.path.join(old, "trainer_state.json"), "w") as f:
        json.dump(st1, f)
    r1 = tpath("gh_v1.jsonl")
    train_run("--steps", "4", "--resume", old, "--record", r1)
    B = records(r1)
    assert [r["passes"] for r in B] == [2, 1], B
    # forced fallback: two passes a step, invariant over layouts
    rf, rf2 = tpath("gh_off.jsonl"), tpath("gh_off2.jsonl")
    train_run("--steps", "3", "--grid-history", "off", "--record", rf)
    train_run("--steps", "3", "--grid-history", "off", "--micro-batches", "4", "--threads", "2",
              "--record", rf2)
    F, F2 = records(rf), records(rf2)
    assert [r["passes"] for r in F] == [2, 2, 2] and F == F2, (F, F2)
    # step 0 has no history either way: the same bits
    assert {k: v for k, v in F[0].items()} == A[0], (F[0], A[0])
    # bad histories and flags
    def bad(name, edit, needles):
        d = tpath("gh_bad_" + name)
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(ck, d)
        s2 = json.loads(json.dumps(st))
        edit(s2)
        with open(os.path.join(d, "trainer_state.json"), "w") as f:
            json.dump(s2, f)
        expect_train_error("--steps", "3", *FAST, "--resume", d, needles=needles)
    bad("missing", lambda s2: s2["grid_history"].pop("lm_head.weight"),
        ("grid_history", "entries"))
    bad("range", lambda s2: s2["grid_history"].__setitem__("lm_head.weight", 200),
        ("grid_history.lm_head.weight",))
    bad("type", lambda s2: s2["grid_history"].__setitem__("loss", "7"), ("grid_history.loss",))
    bad("extra", lambda s2: (s2["grid_history"].pop("lm_head.weight"),
                             s2["grid_history"].__setitem__("model.extra", 1)),
        ("grid_history.lm_head.weight",))
    bad("version", lambda s2: s2.__setitem__("format_version", 3), ("format version",))
    expect_train_error("--steps", "1", *FAST, "--grid-history", "maybe",
                       needles=("--grid-history", "maybe"))


@test
def train_run_layouts_identical():
    base = None
    for args in ((), ("--micro-batches", "2"), ("--micro-batches", "4"), ("--threads", "1"),
                 ("--threads", "3", "--micro-batches", "2")):
        f = tpath("layout.jsonl")
        train_run("--steps", "2", "--record", f, *args)
        rows = records(f)
        if base is None:
            base = rows
        assert rows == base, (args, rows, base)


@test
def train_run_checkpoint_deterministic_and_loadable():
    c1, c2 = tpath("det1"), tpath("det2")
    train_run("--steps", "1", "--save", c1)
    train_run("--steps", "1", "--save", c2, "--threads", "2", "--micro-batches", "2")
    for name in ("model.safetensors", "optimizer/optimizer.safetensors", "config.json", "trainer_state.json"):
        with open(os.path.join(c1, name), "rb") as a, open(os.path.join(c2, name), "rb") as b:
            assert a.read() == b.read(), name
    from safetensors.numpy import load_file
    m = load_file(os.path.join(c1, "model.safetensors"))
    o = load_file(os.path.join(c1, "optimizer", "optimizer.safetensors"))
    assert "lm_head.weight" in m and "model.embed_tokens.weight" in m
    assert all(v.dtype == np.float32 for v in m.values())
    trained = [k for k in m if not k.endswith("e_score_correction_bias")]
    assert sorted(o) == sorted([k + ".exp_avg" for k in trained] + [k + ".exp_avg_sq" for k in trained])
    with open(os.path.join(c1, "config.json")) as fh:
        cfg = json.load(fh)
    assert cfg["model_type"] == "glm4_moe" and cfg["architectures"] == ["Glm4MoeForCausalLM"]
    assert cfg["rope_parameters"]["rope_theta"] == cfg["rope_theta"]
    # save over an existing checkpoint: replaced atomically, no temporary left
    train_run("--steps", "2", "--save", c1)
    with open(os.path.join(c1, "trainer_state.json")) as fh:
        assert json.load(fh)["step"] == 2
    assert not [f for f in os.listdir(Ctx.tmp) if f.startswith("train_det1.tmp")]


@test
def train_run_dump_grads_norm():
    g, r = tpath("grads.safetensors"), tpath("grads.jsonl")
    train_run("--steps", "2", "--dump-grads", g, "--record", r, "--clip", "0")
    last = records(r)[-1]
    d = run_json("norm", g, "--no-progress")
    assert d["total_norm_hex"] == last["grad_norm"], (d["total_norm_hex"], last["grad_norm"])
    assert float.fromhex(last["clip_coef"]) == 1.0


def rewrite_safetensors(src, dst, edit):
    from safetensors.numpy import load_file, save_file
    t = load_file(src)
    edit(t)
    save_file(t, dst, metadata={"format": "pt"})


@test
def train_run_resume_mismatch():
    ck = tpath("mm_ckpt")
    train_run("--steps", "1", "--save", ck)
    import shutil

    def variant(name, fn):
        d = tpath("mm_" + name)
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(ck, d)
        fn(d)
        return d

    def model_edit(edit):
        return lambda d: rewrite_safetensors(os.path.join(d, "model.safetensors"),
                                             os.path.join(d, "model.safetensors"), edit)

    def rename(t):
        t["lm_head.weightX"] = t.pop("lm_head.weight")

    def reshape(t):
        t["lm_head.weight"] = t["lm_head.weight"][:-1]

    def retype(t):
        t["lm_head.weight"] = t["lm_head.weight"].astype(np.float64)

    def extra(t):
        t["model.extra.weight"] = np.zeros(3, dtype=np.float32)

    cases = [
        ("rename", model_edit(rename), ("lm_head.weight", "missing")),
        ("shape", model_edit(reshape), ("lm_head.weight", "shape")),
        ("dtype", model_edit(retype), ("lm_head.weight", "F64")),
        ("extra", model_edit(extra), ("model.extra.weight",)),
        ("nooptim", lambda d: os.remove(os.path.join(d, "optimizer", "optimizer.safetensors")), ("optimizer.safetensors",)),
        ("corrupt", lambda d: open(os.path.join(d, "model.safetensors"), "r+b").write(b"\xff" * 8),
         ("model.safetensors",)),
        ("state", lambda d: open(os.path.join(d, "trainer_state.json"), "w").write("{}"), ("trainer_state.json",)),
    ]
    for name, fn, needles in cases:
        d = variant(name, fn)
        expect_train_error("--steps", "2", *FAST, "--resume", d, needles=needles)
    expect_train_error("--steps", "2", *FAST, "--resume", ck, "--seed", "7", needles=("--seed",))
    expect_train_error("--steps", "2", "--seq-len", "8", "--global-batch", "4", "--resume", ck,
                       needles=("--seq-len",))
    expect_train_error("--steps", "0", *FAST, "--resume", ck, needles=("--steps 0",))
    expect_train_error("--steps", "2", *FAST, "--resume", ck, "--config", config_file("other"),
                       needles=("differs",))


def mpirun_train(np_, *args):
    import shutil
    import subprocess
    if not Ctx.mpi:
        raise Skip("built without MPI")
    mpirun = shutil.which("mpirun")
    if not mpirun:
        raise Skip("no mpirun")
    cmd = [mpirun, "--oversubscribe", "-np", str(np_)]
    if os.geteuid() == 0:
        cmd.insert(1, "--allow-run-as-root")
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=0:" + os.environ.get("ASAN_OPTIONS", ""))
    return subprocess.run(cmd + [Ctx.bin, "train", *map(str, args)], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, timeout=600, env=env)


@test
def train_run_under_mpi_identical():
    one, two, ck1, ck2 = tpath("mpi1.jsonl"), tpath("mpi2.jsonl"), tpath("mpi_ck1"), tpath("mpi_ck2")
    train_run("--steps", "2", "--record", one, "--save", ck1)
    p = mpirun_train(2, *FAST, "--steps", "2", "--record", two, "--save", ck2, "--micro-batches", "2")
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    assert records(one) == records(two), (records(one), records(two))
    for name in ("model.safetensors", "optimizer/optimizer.safetensors"):
        with open(os.path.join(ck1, name), "rb") as a, open(os.path.join(ck2, name), "rb") as b:
            assert a.read() == b.read(), name
    p = mpirun_train(2, "--global-batch", "3", "--record", tpath("mpi_bad.jsonl"))
    err = p.stderr.decode()
    assert p.returncode != 0 and "does not divide over 2 data-parallel ranks" in err, err
    assert not os.path.exists(tpath("mpi_bad.jsonl"))


@test
def train_run_ordinary_under_mpi_drifts():
    """--mode ordinary over ranks is the framework baseline: fp32 sums per
    rank, then MPI's float all-reduce (MPI_FLOAT, MPI_SUM, MPI's order).
    It runs on 1, 2 and 4 ranks and its bits depend on the layout."""
    rows = {}
    for P in (1, 2, 4):
        f = tpath("ord_np%d.jsonl" % P)
        args = (*FAST, "--steps", "3", "--mode", "ordinary", "--record", f)
        if P == 1:
            train_run(*args)
        else:
            p = mpirun_train(P, *args)
            assert p.returncode == 0, p.stderr.decode()[-2000:]
        rows[P] = records(f)
        assert len(rows[P]) == 3, rows[P]
    assert rows[1] != rows[2] or rows[1] != rows[4] or rows[2] != rows[4], \
        "the ordinary mode gave the same bits on 1, 2 and 4 ranks"


@test
def train_run_isas_identical():
    base = None
    for isa in ("portable", "avx2", "avx512"):
        f = tpath("isa_%s.jsonl" % isa)
        rc, out, err = run("train", *FAST, "--steps", "2", "--record", f,
                           env=dict(os.environ, BX_ISA=isa))
        if rc != 0 and isa != "portable" and "ISA" in err:
            continue  # this CPU cannot run it
        assert rc == 0, (isa, err)
        rows = records(f)
        if base is None:
            base = rows
        assert rows == base, (isa, rows, base)


def same_checkpoints(a, b):
    for name in ("model.safetensors", "optimizer/optimizer.safetensors"):
        with open(os.path.join(a, name), "rb") as x, open(os.path.join(b, name), "rb") as y:
            assert x.read() == y.read(), (a, b, name)


def same_files(a, b):
    with open(a, "rb") as x, open(b, "rb") as y:
        assert x.read() == y.read(), (a, b)


@test
def train_run_expert_parallel_identical():
    """--ep E under mpirun -np P: the records, the gradients and the
    checkpoints of one process, for P = 2 (E = 1, 2) and P = 4 (E = 1, 2,
    4; the tiny config's 8 experts), with micro-batches; the summary
    counts the bytes of the collectives."""
    args = ("--seq-len", "16", "--global-batch", "8", "--steps", "2")
    one, ck1, g1 = tpath("ep_one.jsonl"), tpath("ep_ck1"), tpath("ep_g1.safetensors")
    rc, out, err = run("train", *args, "--record", one, "--save", ck1, "--dump-grads", g1)
    assert rc == 0, err
    for P, E, mb in ((2, 1, 1), (2, 2, 2), (4, 1, 1), (4, 2, 2), (4, 4, 1)):
        f, ck, g = (tpath("ep_%d_%d.jsonl" % (P, E)), tpath("ep_ck_%d_%d" % (P, E)),
                    tpath("ep_g_%d_%d.safetensors" % (P, E)))
        p = mpirun_train(P, *args, "--ep", E, "--micro-batches", mb, "--record", f, "--save", ck,
                         "--dump-grads", g)
        assert p.returncode == 0, (P, E, p.stderr.decode()[-2000:])
        assert records(one) == records(f), (P, E)
        same_checkpoints(ck1, ck)
        same_files(g1, g)
        text = p.stdout.decode()
        assert "communication per step (rank 0): --ep %d" % E in text, text
        if E > 1:
            assert "all-to-all 0 bytes" not in text, text


@test
def train_run_expert_parallel_resume():
    """Resumed under another --ep (and rank count) after k steps: the
    steps and the checkpoint of the straight run."""
    args = ("--seq-len", "16", "--global-batch", "8")
    straight, cks = tpath("epr_straight.jsonl"), tpath("epr_cks")
    p = mpirun_train(4, *args, "--steps", "3", "--ep", "4", "--record", straight, "--save", cks)
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    ckk, rest, ckr = tpath("epr_ckk"), tpath("epr_rest.jsonl"), tpath("epr_ckr")
    p = mpirun_train(4, *args, "--steps", "1", "--ep", "2", "--save", ckk)
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    p = mpirun_train(2, *args, "--steps", "3", "--ep", "2", "--resume", ckk, "--record", rest,
                     "--save", ckr)
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    assert records(straight)[1:] == records(rest)
    same_checkpoints(cks, ckr)


@test
def train_run_expert_parallel_bad():
    """--ep that does not divide the ranks or the experts, or differs
    between the ranks: one line, exit 2 on every rank, nothing written."""
    expect_train_error(*FAST, "--ep", "2", needles=("--ep 2 does not divide the 1 rank",))
    rec = tpath("epbad.jsonl")
    cases = (
        (2, ("--ep", "4"), "--ep 4 does not divide the 2 ranks"),
        (3, ("--global-batch", "6", "--ep", "2"), "--ep 2 does not divide the 3 ranks"),
        (4, ("--ep", "4", "--config", config_file("ep6", n_routed_experts=6, n_group=1, topk_group=1)),
         "--ep 4 does not divide n_routed_experts (6)"),
    )
    for P, extra, needle in cases:
        if os.path.exists(rec):
            os.remove(rec)
        p = mpirun_train(P, "--seq-len", "16", "--global-batch", "4", "--steps", "1", *extra,
                         "--record", rec)
        err = p.stderr.decode()
        assert p.returncode != 0, err
        mine = [l for l in err.splitlines() if l.startswith("bitexact: ")]
        assert len(mine) == 1 and needle in mine[0], (extra, err)
        assert not os.path.exists(rec)
    # the ranks disagree on --ep (an MPMD launch): every rank stops
    import shutil
    import subprocess
    mpirun = shutil.which("mpirun")
    cmd = [mpirun, "--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
    base = [Ctx.bin, "train", "--seq-len", "16", "--global-batch", "4", "--steps", "1"]
    cmd += ["-np", "1"] + base + ["--ep", "1", ":", "-np", "1"] + base + ["--ep", "2"]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
    err = p.stderr.decode()
    assert p.returncode != 0 and "ranks disagree on --ep: rank 0 1, rank 1 2" in err, err


# ------------------------------------------------------------- --compute-dtype bf16


@test
def train_run_bf16_layouts_identical():
    """--compute-dtype bf16: bf16 GEMM operands, fp32 accumulation. The
    records and checkpoints are the same bits over threads x micro-batches;
    they differ from fp32's, the step-0 loss within 2% of it; the dtype is
    in every record line and in trainer_state.json."""
    base = ck0 = None
    for k, args in enumerate((("--threads", "1"), ("--threads", "2"), ("--micro-batches", "2"),
                              ("--threads", "2", "--micro-batches", "2"))):
        f, ck = tpath("bf16_%d.jsonl" % k), tpath("bf16_ck%d" % k)
        train_run("--steps", "2", "--compute-dtype", "bf16", "--record", f, "--save", ck, *args)
        rows = records(f)
        assert all(r["compute_dtype"] == "bf16" for r in rows), rows
        if base is None:
            base, ck0 = rows, ck
        assert rows == base, (args, rows, base)
        for name in ("model.safetensors", "optimizer/optimizer.safetensors", "trainer_state.json"):
            same_files(os.path.join(ck0, name), os.path.join(ck, name))
    with open(os.path.join(ck0, "trainer_state.json")) as fh:
        assert json.load(fh)["compute_dtype"] == "bf16"
    f32 = tpath("bf16_fp32.jsonl")
    train_run("--steps", "2", "--record", f32)
    ref = records(f32)
    assert all(r["compute_dtype"] == "fp32" for r in ref), ref
    assert ref[0]["loss_hash"] != base[0]["loss_hash"], "bf16 gave fp32's bits"
    l32, l16 = float.fromhex(ref[0]["loss"]), float.fromhex(base[0]["loss"])
    assert abs(l16 - l32) <= 0.02 * abs(l32), (l16, l32)


@test
def train_run_bf16_under_mpi_identical():
    """bf16 under mpirun -np 2 with --ep 1 and --ep 2: one process's bits."""
    args = ("--seq-len", "16", "--global-batch", "8", "--steps", "2", "--compute-dtype", "bf16")
    one, ck1 = tpath("bf16_mpi_one.jsonl"), tpath("bf16_mpi_ck1")
    rc, out, err = run("train", *args, "--record", one, "--save", ck1)
    assert rc == 0, err
    for E, mb in ((1, 1), (2, 2)):
        f, ck = tpath("bf16_mpi_%d.jsonl" % E), tpath("bf16_mpi_ck_%d" % E)
        p = mpirun_train(2, *args, "--ep", E, "--micro-batches", mb, "--record", f, "--save", ck)
        assert p.returncode == 0, (E, p.stderr.decode()[-2000:])
        assert records(one) == records(f), (E, records(one), records(f))
        same_checkpoints(ck1, ck)


@test
def train_run_bf16_bad_and_resume():
    for v in ("fp16", "BF16", "", "float32"):
        expect_train_error(*FAST, "--steps", "1", "--compute-dtype", v, needles=("--compute-dtype",))
    ck = tpath("bf16_res_ck")
    train_run("--steps", "1", "--save", ck, "--compute-dtype", "bf16")
    expect_train_error(*FAST, "--steps", "2", "--resume", ck, needles=("--compute-dtype", "bf16"))
    expect_train_error(*FAST, "--steps", "2", "--resume", ck, "--compute-dtype", "fp32",
                       needles=("--compute-dtype",))
    # the same dtype resumes, bit for bit with the straight run
    straight, rest = tpath("bf16_straight.jsonl"), tpath("bf16_rest.jsonl")
    train_run("--steps", "2", "--record", straight, "--compute-dtype", "bf16")
    train_run("--steps", "2", "--resume", ck, "--record", rest, "--compute-dtype", "bf16")
    assert records(rest) == records(straight)[1:], (records(rest), records(straight))


# ---- issue 27: schedules, AdamW options, --save-every, signals, --help ----

@test
def subcommand_help():
    for cmd in ("norm", "hash", "diff", "demo", "train", "plot"):
        rc, out, err = run(cmd, "--help")
        assert rc == 0 and err == "", (cmd, rc, err)
        assert out.startswith("usage:\n  bitexact %s" % cmd), (cmd, out[:80])
        assert "Options for every command" in out, cmd
    rc, out, _ = run("train", "--steps", "3", "-h")
    assert rc == 0 and "--lr-scheduler" in out and "--save-every" in out, out


def sched_rate(kind, lr, m, W, N, s):
    """bx_lr_at's formulas with exact rationals (the rational cases only):
    the record's lr must be this, correctly rounded."""
    from fractions import Fraction as F
    if kind == "constant":
        return lr
    if s < W:
        return float(F(lr) * s / W)
    if kind == "constant_with_warmup":
        return lr
    n = max(1, N - W)
    assert kind == "linear"
    return float(F(m) + (F(lr) - F(m)) * F(max(0, N - s), n))


@test
def train_run_lr_schedules():
    """The record's lr is the schedule's rate of each step (exact for the
    rational ones; the cosine: warmup 0 .. lr, then down to --min-lr at the
    end of --steps); betas and epsilon change the run; bad values named."""
    for kind in ("constant", "linear", "constant_with_warmup"):
        f = tpath("sched_%s.jsonl" % kind)
        extra = ("--min-lr", "1e-4") if kind == "linear" else ()
        train_run("--steps", "7", "--lr", "3e-3", "--lr-scheduler", kind, "--warmup-steps", "3",
                  *extra, "--record", f)
        got = [float.fromhex(r["lr"]) for r in records(f)]
        want = [sched_rate(kind, 3e-3, 1e-4 if extra else 0.0, 3, 7, s) for s in range(7)]
        assert got == want, (kind, got, want)
    f = tpath("sched_cos.jsonl")
    train_run("--steps", "9", "--lr", "2e-3", "--lr-scheduler", "cosine", "--warmup-steps", "2",
              "--min-lr", "2e-4", "--record", f)
    lrs = [float.fromhex(r["lr"]) for r in records(f)]
    assert lrs[0] == 0.0 and lrs[1] == 1e-3 and lrs[2] == 2e-3, lrs
    assert all(x > y for x, y in zip(lrs[2:], lrs[3:])) and lrs[-1] > 2e-4, lrs
    import math
    for s in range(2, 9):  # within an ulp or so of the double formula
        ref = 2e-4 + (2e-3 - 2e-4) * 0.5 * (1 + math.cos(math.pi * (s - 2) / 7))
        assert abs(lrs[s] - ref) <= 4e-16 * ref, (s, lrs[s], ref)
    # AdamW's betas and epsilon reach the update
    base, b2 = tpath("adam_base.jsonl"), tpath("adam_b2.jsonl")
    train_run("--steps", "3", "--record", base)
    train_run("--steps", "3", "--adam-beta2", "0.95", "--adam-epsilon", "1e-6", "--record", b2)
    assert records(base)[0]["loss"] == records(b2)[0]["loss"]
    assert records(base)[2]["loss"] != records(b2)[2]["loss"]
    expect_train_error("--lr-scheduler", "warmup", needles=("--lr-scheduler", "warmup"))
    expect_train_error("--adam-beta1", "1", needles=("--adam-beta1", "below 1"))
    expect_train_error("--adam-beta2", "-0.5", needles=("--adam-beta2",))
    expect_train_error("--min-lr", "1", needles=("min_lr",))
    expect_train_error("--min-lr", "1e-5", needles=("linear and cosine",))
    expect_train_error("--warmup-steps", "-1", needles=("--warmup-steps",))
    expect_train_error("--save-every", "2", needles=("--save-every", "--save"), outputs=False)
    expect_train_error("--save-every", "0", "--save", tpath("se0"), needles=("--save-every",))


def start_train(*args):
    import subprocess
    return subprocess.Popen([Ctx.bin, "train", *FAST, "--json", *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def wait_lines(f, n, p, timeout=120):
    import time
    t0 = time.time()
    while time.time() - t0 < timeout:
        if p.poll() is not None:
            return False
        try:
            with open(f) as fh:
                if sum(1 for _ in fh) >= n:
                    return True
        except OSError:
            pass
        time.sleep(0.02)
    return False


@test
def train_run_sigterm_saves_and_resumes():
    """SIGTERM mid-run: the step in progress finishes, its record line is
    written, the checkpoint holds that step, exit 0; --resume continues and
    the records equal an uninterrupted run's."""
    import signal
    args = ("--lr-scheduler", "cosine", "--warmup-steps", "2", "--steps", "40")
    full = tpath("sig_full.jsonl")
    train_run(*args, "--record", full)
    first, rest, ck = tpath("sig_a.jsonl"), tpath("sig_b.jsonl"), tpath("sig_ck")
    p = start_train(*args, "--record", first, "--save", ck)
    assert wait_lines(first, 3, p), p.communicate()[1].decode()
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err.decode()
    summary = json.loads(out)
    assert summary["stopped_by_signal"] is True, summary
    k = len(records(first))
    assert 3 <= k < 40, k
    with open(os.path.join(ck, "trainer_state.json")) as fh:
        assert json.load(fh)["step"] == k
    train_run(*args, "--resume", ck, "--record", rest)
    assert records(first) + records(rest) == records(full)


@test
def train_run_save_every_survives_kill():
    """--save-every K then SIGKILL: DIR holds the last complete multiple of
    K (never a partial checkpoint); resuming from it gives the uninterrupted
    run's records."""
    import signal
    args = ("--steps", "30", "--lr-scheduler", "linear", "--min-lr", "1e-4")
    full = tpath("se_full.jsonl")
    train_run(*args, "--record", full)
    first, rest, ck = tpath("se_a.jsonl"), tpath("se_b.jsonl"), tpath("se_ck")
    p = start_train(*args, "--record", first, "--save", ck, "--save-every", "4")
    assert wait_lines(first, 10, p), p.communicate()[1].decode()
    p.send_signal(signal.SIGKILL)
    p.communicate()
    with open(os.path.join(ck, "trainer_state.json")) as fh:
        k = json.load(fh)["step"]
    assert k % 4 == 0 and k >= 8, k
    train_run(*args, "--resume", ck, "--record", rest)
    assert records(full)[:k] == records(first)[:k]
    assert records(full)[k:] == records(rest)


@test
def train_run_sigterm_under_mpi():
    """SIGTERM to one rank of mpirun -np 2: the flag is agreed after the
    step, so every rank finishes it, the checkpoint is written, all exit 0."""
    import shutil
    import signal
    import subprocess
    import time
    if not Ctx.mpi or not shutil.which("mpirun"):
        raise Skip("no MPI")
    first, ck = tpath("mpisig.jsonl"), tpath("mpisig_ck")
    cmd = ["mpirun", "--oversubscribe", "-np", "2"]
    if os.geteuid() == 0:
        cmd.insert(1, "--allow-run-as-root")
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=0:" + os.environ.get("ASAN_OPTIONS", ""))
    p = subprocess.Popen(cmd + [Ctx.bin, "train", *FAST, "--steps", "200", "--record", first,
                                "--save", ck], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=env)
    assert wait_lines(first, 2, p), p.communicate()[1].decode()
    pids = subprocess.run(["pgrep", "-f", "-P", str(p.pid), "bitexact"], stdout=subprocess.PIPE)
    kids = [int(x) for x in pids.stdout.split()]
    if not kids:  # mpirun forks through its daemon: find the ranks by their record path
        time.sleep(0.1)
        kids = [int(x) for x in subprocess.run(["pgrep", "-f", first], stdout=subprocess.PIPE)
                .stdout.split() if int(x) != p.pid]
    assert kids, "no rank process found"
    os.kill(max(kids), signal.SIGTERM)  # one rank only
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err.decode()[-2000:]
    k = len(records(first))
    assert 2 <= k < 200, k
    with open(os.path.join(ck, "trainer_state.json")) as fh:
        assert json.load(fh)["step"] == k


def eval_file(name, tokens, seed):
    f = tpath(name)
    np.save(f, np.random.default_rng(seed).integers(0, 256, tokens).astype(np.int32))
    return f


@test
def train_run_eval_loss():
    """--eval-data: the exact mean loss over the eval batches after every
    K-th step and the last. With the training file as the eval file and
    exactly one batch in it, every step trains on that batch, so the eval
    loss after step s must be the loss of step s + 1, bit for bit (fp32 and
    bf16 compute)."""
    one = eval_file("eval_one.npy", 4 * 16 + 1, 2)  # one batch of FAST's B = 4, L = 16
    for dt in ("fp32", "bf16"):
        f = tpath("eval_one_%s.jsonl" % dt)
        train_run("--steps", "4", "--data", one, "--eval-data", one, "--eval-every", "1",
                  "--compute-dtype", dt, "--record", f)
        rows = records(f)
        assert all("eval_loss" in r for r in rows), rows
        for a, b in zip(rows, rows[1:]):
            assert a["eval_loss"] == b["loss"], (dt, a, b)
    ev = eval_file("eval_many.npy", 4000, 1)
    f = tpath("eval_every.jsonl")
    s = train_run("--steps", "5", "--eval-data", ev, "--eval-every", "2", "--eval-batches", "3",
                  "--record", f)
    rows = records(f)
    assert [("eval_loss" in r) for r in rows] == [False, True, False, True, True], rows
    assert s["last_eval_loss"] == rows[-1]["eval_loss"], s
    plain = tpath("eval_none.jsonl")  # evaluating changes nothing of the training
    train_run("--steps", "5", "--record", plain)
    assert records(plain) == [{k: v for k, v in r.items() if k != "eval_loss"} for r in rows]
    expect_train_error("--eval-data", ev, needles=("--eval-every",))
    expect_train_error("--eval-every", "2", needles=("--eval-data",))
    expect_train_error("--eval-batches", "2", needles=("--eval-batches", "--eval-data"))
    expect_train_error("--eval-data", ev, "--eval-every", "1", "--eval-batches", "999",
                       needles=("--eval-batches 999", "batches"))
    tiny = eval_file("eval_tiny.npy", 200, 3)  # 3 sequences of the default L = 64 < B = 8
    expect_train_error("--eval-data", tiny, "--eval-every", "1", needles=("fewer than one batch",))
    expect_train_error("--eval-data", tpath("no_such.npy"), "--eval-every", "1",
                       needles=("no_such.npy",))


@test
def train_run_eval_loss_layout_invariant():
    """The eval loss is the same bits on 1 and 2 threads, 2 micro-batches,
    and (with MPI) 2 ranks, 4 ranks with --ep 2 and --ep 4."""
    ev = eval_file("eval_inv.npy", 3000, 5)
    args = ("--steps", "3", "--eval-data", ev, "--eval-every", "2")
    want = None
    runs = [("--threads", "1"), ("--threads", "2"), ("--micro-batches", "2")]
    for extra in runs:
        f = tpath("eval_inv.jsonl")
        train_run(*args, *extra, "--record", f)
        got = [r.get("eval_loss") for r in records(f)]
        want = want or got
        assert got == want and got[1] is not None, (extra, got, want)
    if not Ctx.mpi:
        return
    for P, extra in ((2, ()), (4, ("--ep", "2")), (4, ("--ep", "4"))):
        f = tpath("eval_inv_mpi.jsonl")
        p = mpirun_train(P, *FAST, *args, *extra, "--record", f)
        assert p.returncode == 0, p.stderr.decode()[-2000:]
        assert [r.get("eval_loss") for r in records(f)] == want, (P, extra)


# ---- bitexact plot ---------------------------------------------------------

def svg_of(path):
    import xml.etree.ElementTree as ET
    root = ET.parse(path).getroot()  # well-formed XML, or this raises
    ns = "{http://www.w3.org/2000/svg}"
    assert root.tag == ns + "svg", root.tag
    w, h = float(root.get("width")), float(root.get("height"))
    lines = []
    for pl in root.iter(ns + "polyline"):
        pts = [tuple(map(float, p.split(","))) for p in pl.get("points").split()]
        for x, y in pts:
            assert 0 <= x <= w and 0 <= y <= h, (x, y, w, h)
        lines.append((pl.get("stroke"), pl.get("stroke-dasharray"), pts))
    texts = [t.text or "" for t in root.iter(ns + "text")]
    return lines, texts


@test
def plot_records_and_drift():
    """bitexact plot: a well-formed SVG with one curve per run and panel
    (loss with eval_loss dashed, lr, grad_norm), points inside the canvas,
    the labels in the legend; --drift draws an identical record as the flat
    line at 0 ULP and a different one above it."""
    ev = eval_file("plot_eval.npy", 3000, 4)
    a, b = tpath("plot_a.jsonl"), tpath("plot_b.jsonl")
    train_run("--steps", "6", "--lr-scheduler", "cosine", "--warmup-steps", "2", "--eval-data", ev,
              "--eval-every", "3", "--record", a)
    train_run("--steps", "6", "--lr", "3e-3", "--record", b)
    svg = tpath("plot.svg")
    rc, out, err = run("plot", "--label", "cosine", "--label", "constant", "-o", svg, a, b)
    assert rc == 0 and "3 panels, 2 runs" in out, (rc, out, err)
    lines, texts = svg_of(svg)
    solid = [l for l in lines if l[1] is None]
    dashed = [l for l in lines if l[1] is not None]
    assert len(solid) == 6 and len(dashed) == 1, (len(solid), len(dashed))  # 3 panels x 2; eval of a
    assert all(len(p) == 6 for _, _, p in solid) and len(dashed[0][2]) == 2
    assert "cosine" in texts and "constant" in texts and "lr" in texts, texts
    # drift: b against itself is 0 ULP everywhere (the bottom of the frame); a is not
    d = tpath("drift.svg")
    rc, out, err = run("plot", "--drift", b, "-o", d, b, a)
    assert rc == 0, err
    lines, texts = svg_of(d)
    same, other = lines[0][2], lines[1][2]
    assert len({y for _, y in same}) == 1, same
    assert max(y for _, y in other) == same[0][1] and min(y for _, y in other) < same[0][1], other
    assert any("max 0 ULP" in t for t in texts) and any("ULP" in t and "max 0" not in t for t in texts)


@test
def plot_bad_input():
    a = tpath("plot_bad_a.jsonl")
    train_run("--steps", "2", "--record", a)
    svg = tpath("plot_bad.svg")
    with open(svg, "w") as f:
        f.write("keep")
    cases = [
        ((a,), ("-o",)),
        (("-o", svg), ("no RECORD",)),
        (("-o", svg, tpath("none.jsonl")), ("none.jsonl",)),
        (("-o", svg, "--label", "x", "--label", "y", a), ("--label",)),
        (("-o", svg, "--bogus", a), ("--bogus",)),
        (("-o", tpath("nodir/x.svg"), a), ("nodir",)),
    ]
    bad = tpath("plot_bad.jsonl")
    with open(bad, "w") as f:
        f.write('{"step": 0, "loss": "0x1p+0"}\n{"step": 1, "loss": \n')
    cases.append((("-o", svg, bad), ("line 2",)))
    other = tpath("plot_other.jsonl")
    with open(other, "w") as f:
        f.write('{"step": 50, "loss": "0x1p+0"}\n')
    cases.append((("-o", svg, "--drift", other, a), ("no step in common",)))
    for args, needles in cases:
        rc, out, err = run("plot", *args)
        assert rc == 2 and out == "" and err.count("\n") == 1, (args, rc, out, err)
        assert all(n in err for n in needles), (args, err)
        with open(svg) as f:
            assert f.read() == "keep", args  # nothing written on error
    assert not [n for n in os.listdir(os.path.dirname(svg)) if ".svg.tmp-" in n]

# ------------------------------------------- --init-from, sharded checkpoints

def st_write(path, tensors, metadata=None):
    """A safetensors file written here (any dtype, raw bytes): tensors is
    {name: (dtype, shape, bytes)}, in that order in the file."""
    header, off, blobs = {}, 0, []
    if metadata is not None:
        header["__metadata__"] = metadata
    for n, (dt, shape, data) in tensors.items():
        header[n] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(data)]}
        off += len(data)
        blobs.append(data)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def st_read(path):
    """{name: (dtype, shape, bytes)} of a safetensors file."""
    with open(path, "rb") as f:
        b = f.read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    h.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in h.items()}


def init_source():
    """A `--steps 0` checkpoint of the built-in config (F32), made once."""
    d = tpath("init_src")
    if not os.path.isdir(d):
        train_run("--steps", "0", "--save", d)
    return d


def init_variant(name, tensors, index=None, shards=None, config=None):
    """DIR with config.json (the source's, or config) and the model as
    model.safetensors (tensors) or, with shards ({file: [names]}), shards
    and an index (index: the index object to write instead)."""
    import shutil
    d = tpath("init_" + name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    src = init_source()
    if config is None:
        shutil.copy(os.path.join(src, "config.json"), d)
    else:
        with open(os.path.join(d, "config.json"), "w") as f:
            f.write(config)
    if shards is None:
        st_write(os.path.join(d, "model.safetensors"), tensors)
        return d
    wm = {}
    for f, names in shards.items():
        st_write(os.path.join(d, f), {n: tensors[n] for n in names})
        wm.update({n: f for n in names})
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as fh:
        json.dump(index if index is not None else {"metadata": {"total_size": 0}, "weight_map": wm}, fh)
    return d


def to_bf16_bits(a):
    """fp32 -> bf16 bit patterns, round to nearest even (finite inputs)."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


@test
def train_init_from_widens_exactly():
    """--init-from of BF16 and F16 tensors (every finite F16 pattern, a
    spread of BF16 patterns with subnormals and extremes), sharded with an
    index, mixed with F32: `--steps 0 --save` writes each widened exactly
    (compared bit for bit with numpy's float16 -> float32 and bf16 << 16)."""
    src = st_read(os.path.join(init_source(), "model.safetensors"))
    names = sorted(src)
    t = {}
    f16_all = np.arange(0, 1 << 16, dtype=np.uint32).astype(np.uint16)
    f16_all = f16_all[(f16_all & 0x7C00) != 0x7C00]  # the finite ones (63488)
    rng = np.random.default_rng(5)
    bf_spread = rng.integers(0, 1 << 16, 131072, dtype=np.uint32).astype(np.uint16)
    bf_spread = np.where((bf_spread & 0x7F80) == 0x7F80, bf_spread & 0x807F, bf_spread)  # finite
    expect = {}
    for i, n in enumerate(names):
        dt, shape, data = src[n]
        a = np.frombuffer(data, dtype="<f4")
        if n == "model.embed_tokens.weight":  # every finite F16 pattern, then zeros
            h = np.zeros(a.size, dtype=np.uint16)
            h[:f16_all.size] = f16_all
            t[n] = ("F16", shape, h.tobytes())
            expect[n] = h.view(np.float16).astype(np.float32)
        elif n == "lm_head.weight":  # BF16 patterns
            t[n] = ("BF16", shape, bf_spread[:a.size].tobytes())
            expect[n] = (bf_spread[:a.size].astype(np.uint32) << 16).view(np.float32)
        elif i % 3 == 0:
            b = to_bf16_bits(a)
            t[n] = ("BF16", shape, b.tobytes())
            expect[n] = (b.astype(np.uint32) << 16).view(np.float32)
        elif i % 3 == 1:
            h = a.astype(np.float16)
            t[n] = ("F16", shape, h.tobytes())
            expect[n] = h.astype(np.float32)
        else:
            t[n] = (dt, shape, data)
            expect[n] = a
    shards = {"model-00001-of-00003.safetensors": names[0::3], "model-00002-of-00003.safetensors": names[1::3],
              "model-00003-of-00003.safetensors": names[2::3]}
    d = init_variant("widen", t, shards=shards)
    out = tpath("init_widen_out")
    train_run("--steps", "0", "--init-from", d, "--save", out)
    got = st_read(os.path.join(out, "model.safetensors"))
    assert sorted(got) == names
    for n in names:
        assert got[n][0] == "F32" and got[n][1] == t[n][1], n
        assert got[n][2] == expect[n].astype("<f4").tobytes(), n
    # a fresh optimizer and step 0
    o = st_read(os.path.join(out, "optimizer", "optimizer.safetensors"))
    assert all(v[2] == bytes(len(v[2])) for v in o.values())
    with open(os.path.join(out, "trainer_state.json")) as f:
        st = json.load(f)
    assert st["step"] == 0 and "grid_history" not in st


@test
def train_init_from_runs_as_the_f32_model():
    """--init-from of the run's own initial checkpoint (F32, one file) gives
    the run's records; absent e_score_correction_bias buffers are zeros
    (the initial value); --config must equal the checkpoint's."""
    src = init_source()
    ra, rb = tpath("init_a.jsonl"), tpath("init_b.jsonl")
    data = tpath("init_data.npy")
    np.save(data, np.random.default_rng(3).integers(0, 1024, 4000).astype(np.int32))
    train_run("--steps", "2", "--record", ra, "--data", data)
    # another seed: only the initial model would differ, and --init-from replaces it
    train_run("--steps", "2", "--record", rb, "--init-from", src, "--seed", "9", "--data", data)
    A, B = records(ra), records(rb)
    assert [r["loss"] for r in A] == [r["loss"] for r in B]
    t = st_read(os.path.join(src, "model.safetensors"))
    ecb = [n for n in t if n.endswith("e_score_correction_bias")]
    assert ecb and all(t[n][2] == bytes(len(t[n][2])) for n in ecb)
    d = init_variant("noecb", {n: v for n, v in t.items() if n not in ecb})
    rc = tpath("init_c.jsonl")
    train_run("--steps", "1", "--record", rc, "--init-from", d, "--data", data)
    assert records(rc)[0]["loss"] == A[0]["loss"]
    cfg = os.path.join(src, "config.json")
    train_run("--steps", "0", "--init-from", src, "--config", cfg)


@test
def train_init_from_errors():
    src = init_source()
    t = st_read(os.path.join(src, "model.safetensors"))
    names = sorted(t)
    half = {"model-00001-of-00002.safetensors": names[:20], "model-00002-of-00002.safetensors": names[20:]}

    def without(n):
        return {k: v for k, v in t.items() if k != n}

    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    i32 = dict(t)
    dt, shape, data = t["lm_head.weight"]
    i32["lm_head.weight"] = ("I32", shape, data)
    nan = dict(t)
    a = np.frombuffer(data, dtype="<f4").copy()
    a[7] = np.nan
    nan["lm_head.weight"] = ("F32", shape, a.tobytes())
    short = dict(t)
    short["lm_head.weight"] = ("F32", [shape[0] - 1, shape[1]], data[:-4 * shape[1]])
    wm = {n: f for f, ns in half.items() for n in ns}
    cases = [
        ("missing", init_variant("e_missing", without("model.norm.weight")),
         ("model.norm.weight", "missing")),
        ("missing_sharded", init_variant("e_missing_sh", without("model.norm.weight"),
                                         shards={f: [n for n in ns if n != "model.norm.weight"]
                                                 for f, ns in half.items()}),
         ("model.norm.weight", "missing")),
        ("extra", init_variant("e_extra", dict(t, **{"model.mtp.weight": ("F32", [2], bytes(8))})),
         ("model.mtp.weight", "not a tensor of this model")),
        ("i32", init_variant("e_i32", i32), ("lm_head.weight", "I32")),
        ("shape", init_variant("e_shape", short), ("lm_head.weight", "shape")),
        ("nan", init_variant("e_nan", nan), ("lm_head.weight", "NaN")),
        ("corrupt_index", init_variant("e_cindex", t, shards=half), ("model.safetensors.index.json",)),
        ("index_missing_shard", init_variant("e_nosh", t, shards=half,
                                             index={"weight_map": dict(wm, **{"lm_head.weight": "model-00003-of-00003.safetensors"})}),
         ("model-00003-of-00003.safetensors",)),
        ("index_wrong_shard", init_variant("e_wrongsh", t, shards=half,
                                           index={"weight_map": dict(wm, **{names[0]: "model-00002-of-00002.safetensors"})}),
         (names[0], "model-00002-of-00002.safetensors")),
        ("index_unlisted", init_variant("e_unlisted", t, shards=half,
                                        index={"weight_map": {n: f for n, f in wm.items() if n != names[-1]}}),
         (names[-1], "does not list")),
        ("index_path", init_variant("e_path", t, shards=half,
                                    index={"weight_map": dict(wm, **{names[0]: "../x.safetensors"})}),
         ("../x.safetensors",)),
        ("index_no_map", init_variant("e_nomap", t, shards=half, index={"metadata": {}}), ("weight_map",)),
        ("model_type", init_variant("e_mtype", t, config=json.dumps(dict(cfg, model_type="llama"))),
         ("model_type", "llama")),
        ("scoring", init_variant("e_scoring", t, config=json.dumps(dict(cfg, scoring_func="softmax"))),
         ("scoring_func",)),
    ]
    with open(os.path.join(tpath("init_e_cindex"), "model.safetensors.index.json"), "w") as f:
        f.write('{"weight_map": {"a": ')
    both = init_variant("e_both", t, shards=half)
    st_write(os.path.join(both, "model.safetensors"), t)
    cases.append(("both", both, ("model.safetensors.index.json", "both")))
    truncated = init_variant("e_trunc", t, shards=half)
    p = os.path.join(truncated, "model-00002-of-00002.safetensors")
    with open(p, "r+b") as f:
        f.truncate(os.path.getsize(p) - 4)
    cases.append(("truncated_shard", truncated, ("model-00002-of-00002.safetensors",)))
    for name, d, needles in cases:
        expect_train_error("--steps", "1", *FAST, "--init-from", d, needles=needles)
    expect_train_error("--steps", "1", *FAST, "--init-from", tpath("init_nothing"), needles=("init-from",))
    expect_train_error("--steps", "1", *FAST, "--init-from", src, "--resume", src,
                       needles=("--init-from", "--resume"))
    expect_train_error("--steps", "1", *FAST, "--init-from", src, "--config", config_file("other"),
                       needles=("differs",))
    for bad in ("5XB", "0", "1.5GB", "GB", "-3MB", "99999999999999999999"):
        expect_train_error("--steps", "1", *FAST, "--save-max-shard-size", bad,
                           needles=("--save-max-shard-size",))
    expect_train_error("--steps", "1", *FAST, "--save-max-shard-size", "1MB", needles=("--save",),
                       outputs=False)


def hf_size(s):
    """transformers' convert_file_size_to_int (5.24), for the comparison."""
    if s.upper().endswith("GIB"):
        return int(s[:-3]) * 2**30
    if s.upper().endswith("MIB"):
        return int(s[:-3]) * 2**20
    if s.upper().endswith("KIB"):
        return int(s[:-3]) * 2**10
    for u, m in (("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if s.upper().endswith(u):
            v = int(s[:-2]) * m
            return v // 8 if s.endswith("b") else v
    raise ValueError(s)


@test
def train_run_sharded_checkpoint():
    """--save-max-shard-size: shards of at most SIZE (a larger tensor alone)
    and an index in transformers' format; the same bytes for every layout;
    --resume of it, of the one-file checkpoint and of the old layout
    (optimizer.safetensors beside the model) continues bit for bit."""
    ra, rb, rc = tpath("sh_a.jsonl"), tpath("sh_b.jsonl"), tpath("sh_c.jsonl")
    c1, c2, c3 = tpath("sh1"), tpath("sh2"), tpath("sh3")
    train_run("--steps", "4", "--record", ra)
    train_run("--steps", "2", "--save", c1, "--save-max-shard-size", "200KB")
    train_run("--steps", "2", "--save", c2, "--save-max-shard-size", "200000", "--threads", "2",
              "--micro-batches", "2")
    files = sorted(os.listdir(c1))
    assert files == sorted(os.listdir(c2))
    shards = [f for f in files if f.startswith("model-")]
    assert "model.safetensors" not in files and "optimizer.safetensors" not in files
    assert len(shards) > 2 and all(f.endswith(f"-of-{len(shards):05d}.safetensors") for f in shards)
    for f in files + ["optimizer/optimizer.safetensors"]:
        if f != "optimizer":
            same_files(os.path.join(c1, f), os.path.join(c2, f))
    with open(os.path.join(c1, "model.safetensors.index.json")) as fh:
        text = fh.read()
    ix = json.loads(text)
    assert text == json.dumps(ix, indent=2, sort_keys=True) + "\n"
    sizes, params = 0, 0
    for f in shards:
        t = st_read(os.path.join(c1, f))
        b = sum(len(v[2]) for v in t.values())
        assert b <= 200000 or len(t) == 1, (f, b)
        assert all(ix["weight_map"][n] == f for n in t)
        sizes += b
        params += sum(len(v[2]) // 4 for n, v in t.items() if not n.endswith("e_score_correction_bias"))
    assert ix["metadata"] == {"total_size": sizes, "total_parameters": params}
    assert len(ix["weight_map"]) == sum(len(st_read(os.path.join(c1, f))) for f in shards)
    train_run("--steps", "4", "--resume", c1, "--record", rb)
    assert records(rb) == records(ra)[2:]
    # the old layout: optimizer.safetensors beside a one-file model
    train_run("--steps", "2", "--save", c3)
    os.rename(os.path.join(c3, "optimizer", "optimizer.safetensors"), os.path.join(c3, "optimizer.safetensors"))
    os.rmdir(os.path.join(c3, "optimizer"))
    train_run("--steps", "4", "--resume", c3, "--record", rc)
    assert records(rc) == records(ra)[2:]
    # both layouts at once: refused by name
    os.makedirs(os.path.join(c3, "optimizer"))
    with open(os.path.join(c3, "optimizer", "optimizer.safetensors"), "wb") as fh:
        fh.write(open(os.path.join(c3, "optimizer.safetensors"), "rb").read())
    expect_train_error("--steps", "4", *FAST, "--resume", c3, needles=("optimizer.safetensors", "both"))
    # a sharded checkpoint replaced by a one-file one (and back): nothing left over
    train_run("--steps", "3", "--resume", c1, "--save", c1)
    assert sorted(os.listdir(c1)) == ["config.json", "model.safetensors", "optimizer", "trainer_state.json"]
    train_run("--steps", "4", "--resume", c1, "--save", c1, "--save-max-shard-size", "1MiB")
    assert "model.safetensors" not in os.listdir(c1)
    assert not [f for f in os.listdir(Ctx.tmp) if f.startswith("train_sh1.tmp")]
    # every size form transformers reads
    for s in ("300KB", "300kB", "2400Kb", "1MiB", "256KiB", "1GB", "8Gb", "1GiB", "123456"):
        d = tpath("sh_size")
        train_run("--steps", "0", "--save", d, "--save-max-shard-size", s)
        want = int(s) if s.isdigit() else hf_size(s)
        if os.path.exists(os.path.join(d, "model.safetensors.index.json")):
            for f in os.listdir(d):
                if f.startswith("model-"):
                    t = st_read(os.path.join(d, f))
                    assert sum(len(v[2]) for v in t.values()) <= want or len(t) == 1, (s, f)
        else:
            total = sum(len(v[2]) for v in st_read(os.path.join(d, "model.safetensors")).values())
            assert total <= want, (s, total)


@test
def train_run_sharded_under_mpi_ep():
    """--init-from a sharded BF16 checkpoint and --save-max-shard-size under
    mpirun -np 2 --ep 2: the records and the shards of one process."""
    src = st_read(os.path.join(init_source(), "model.safetensors"))
    names = sorted(src)
    t = {n: ("BF16", v[1], to_bf16_bits(np.frombuffer(v[2], dtype="<f4")).tobytes()) for n, v in src.items()}
    d = init_variant("mpi_bf16", t, shards={"model-00001-of-00002.safetensors": names[:30],
                                            "model-00002-of-00002.safetensors": names[30:]})
    one, two, ck1, ck2 = tpath("shmpi1.jsonl"), tpath("shmpi2.jsonl"), tpath("shmpi_ck1"), tpath("shmpi_ck2")
    train_run("--steps", "2", "--init-from", d, "--record", one, "--save", ck1, "--save-max-shard-size", "300KB")
    p = mpirun_train(2, *FAST, "--steps", "2", "--init-from", d, "--record", two, "--save", ck2,
                     "--save-max-shard-size", "300KB", "--ep", "2")
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    assert records(one) == records(two)
    assert sorted(os.listdir(ck1)) == sorted(os.listdir(ck2))
    for f in os.listdir(ck1) + ["optimizer/optimizer.safetensors"]:
        if f != "optimizer":
            same_files(os.path.join(ck1, f), os.path.join(ck2, f))
