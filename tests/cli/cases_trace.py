"""`bitexact train --trace FILE` (issue 28, docs/trace.md): the trace of
the C trainer is the same bytes on every layout (threads, micro-batches,
ranks, expert parallelism) and across --resume; its entries are what they
claim (the last step's gradient and parameter entries are recomputed here
with the xxhash package from --dump-grads and the checkpoint, the head
values with float.hex, the model id from the checkpoint's names and
shapes); `bitexact diff --trace` names the first divergence of the
ordinary mode and of a planted one-ULP change (BITEXACT_TRACE_PLANT, the
test hook) exactly; --dump writes the one entry's values; bad flags are
refused with one line."""
import json
import os

from harness import *  # noqa: F401,F403 - the shared helpers and data
from harness import np, xxhash  # noqa: F401
from cases_train import FAST, mpirun_train, tpath, train_run


def lines(f):
    with open(f, "rb") as fh:
        return fh.read().splitlines()


def entries(f):
    ls = lines(f)
    return json.loads(ls[0]), [json.loads(l) for l in ls[1:]]


def trace_diff(a, b):
    rc, out, err = run("diff", "--trace", "--json", a, b)
    assert rc in (0, 1), (rc, out, err)
    return rc, json.loads(out)


def entry_of(arr):
    """hash, blocks, head of a float32 array as docs/trace.md defines them."""
    a = np.ascontiguousarray(arr, dtype=np.float32).reshape(-1)
    raw, n = a.tobytes(), a.size
    nb = min(16, n)
    blocks = "".join(xxhash.xxh3_64_hexdigest(raw[(j * n // nb) * 4:((j + 1) * n // nb) * 4])
                     for j in range(nb))
    return xxhash.xxh3_64_hexdigest(raw), blocks, [float(v).hex() for v in a[:8]]


@test
def train_trace_layouts_identical():
    need_xxhash()
    base = tpath("tr_base.trace")
    train_run("--steps", "2", "--trace", base)
    head, es = entries(base)
    assert head["bitexact_trace"] == 1 and head["producer"].startswith("bitexact train ")
    steps = {e["step"] for e in es}
    assert steps == {0, 1}, steps
    # per step: every module output and input gradient of every one of the 4 sequences
    fw = [e for e in es if e["step"] == 0 and e["phase"] == "forward"]
    assert {e["slice"] for e in fw} == {0, 1, 2, 3}
    assert fw[0]["module"] == "model.embed_tokens" and fw[0]["shape"] == [16, 128], fw[0]
    mods = list(dict.fromkeys(e["module"] for e in fw))
    assert mods[:7] == ["model.embed_tokens", "model.layers.0.input_layernorm",
                        "model.layers.0.self_attn.o_proj", "model.layers.0.self_attn",
                        "model.layers.0.post_attention_layernorm", "model.layers.0.mlp",
                        "model.layers.0"], mods
    assert mods[-3:] == ["model.norm", "model", "lm_head"], mods
    bw = [e for e in es if e["step"] == 0 and e["phase"] == "backward"]
    assert bw[0]["module"] == "lm_head" and bw[0]["what"] == "grad_input.0"
    grads = [e for e in bw if e["what"] == "grad"]
    assert grads[0]["module"] == "lm_head.weight" and grads[-1]["module"] == "model.embed_tokens.weight"
    layouts = [("--micro-batches", "2"), ("--micro-batches", "4", "--threads", "2"),
               ("--threads", "1")]
    for args in layouts:
        f = tpath("tr_layout.trace")
        train_run("--steps", "2", "--trace", f, *args)
        assert lines(f) == lines(base), args
    if Ctx.mpi:
        for np_, extra in ((2, ()), (2, ("--ep", "2")), (4, ("--ep", "4"))):
            f = tpath("tr_mpi.trace")
            p = mpirun_train(np_, *FAST, "--steps", "2", "--trace", f, "--micro-batches", "1", *extra)
            assert p.returncode == 0, p.stderr.decode()[-2000:]
            assert lines(f) == lines(base), (np_, extra)
    rc, d = trace_diff(base, f)
    assert rc == 0 and d["identical"], d


@test
def train_trace_entries_are_the_values():
    """The last step's gradients (before clipping: --dump-grads) and
    updated parameters (the checkpoint) hash to the trace's entries; the
    model id is the documented hash of the parameters' names and shapes."""
    need_xxhash()
    from safetensors.numpy import load_file
    f, g, ck = tpath("tr_vals.trace"), tpath("tr_vals_grads.safetensors"), tpath("tr_vals_ck")
    train_run("--steps", "2", "--trace", f, "--dump-grads", g, "--save", ck, "--clip", "0.01")
    head, es = entries(f)
    grads, model = load_file(g), load_file(os.path.join(ck, "model.safetensors"))
    last = {(e["phase"], e["module"], e["what"]): e for e in es if e["step"] == 1}
    checked = 0
    for name, arr in model.items():
        if name.endswith("e_score_correction_bias"):
            assert ("optimizer", name, "param") not in last, name  # a buffer: not traced
            continue
        for phase, what, val in (("backward", "grad", grads[name]), ("optimizer", "param", arr)):
            e = last[(phase, name, what)]
            h, blocks, hd = entry_of(val)
            assert (e["hash"], e["blocks"], e["head"]) == (h, blocks, hd), (name, what)
            assert e["shape"] == list(val.shape) and e["slice"] is None and e["dtype"] == "F32"
            checked += 1
    assert checked == 2 * len([n for n in model if not n.endswith("e_score_correction_bias")])
    # the model id: the parameters in the trainer's order (the hub's), "name:d0,d1;"
    with open(ck + "/model.safetensors", "rb") as fh:
        n = int.from_bytes(fh.read(8), "little")
        meta = json.loads(fh.read(n))
    order = [e["module"] for e in es if e["step"] == 1 and e["phase"] == "optimizer"]
    s = "".join(f"{k}:{','.join(str(d) for d in meta[k]['shape'])};" for k in order)
    with open(ck + "/config.json") as fh:
        cfg = json.load(fh)
    c = (f"partial_rotary_factor={float(cfg['partial_rotary_factor']).hex()};"
         f"rope_theta={float(cfg['rope_theta']).hex()};rms_norm_eps={float(cfg['rms_norm_eps']).hex()};"
         f"num_experts_per_tok={cfg['num_experts_per_tok']};n_group={cfg['n_group']};"
         f"topk_group={cfg['topk_group']};norm_topk_prob={int(cfg['norm_topk_prob'])};"
         f"routed_scaling_factor={float(cfg['routed_scaling_factor']).hex()};")
    assert head["model"] == "Glm4MoeForCausalLM:" + xxhash.xxh3_64_hexdigest(s.encode()) + ":" + \
        xxhash.xxh3_64_hexdigest(c.encode()), head
    # another config (rope_theta only: no shape changes) is refused by diff, by name
    from cases_train import config_file
    other = tpath("tr_other.trace")
    train_run("--steps", "1", "--trace", other, "--config", config_file("tr_theta", rope_theta=5e5))
    mine = tpath("tr_mine.trace")
    train_run("--steps", "1", "--trace", mine, "--config", config_file("tr_theta0"))
    rc, out, err = run("diff", "--trace", mine, other)
    assert rc == 2 and "model" in err and len(err.strip().splitlines()) == 1, (rc, out, err)


@test
def train_trace_resume_continues():
    a, b, c, ck = tpath("tr_full.trace"), tpath("tr_half.trace"), tpath("tr_rest.trace"), tpath("tr_ck")
    train_run("--steps", "4", "--trace", a)
    train_run("--steps", "2", "--trace", b, "--save", ck)
    train_run("--steps", "4", "--trace", c, "--resume", ck)
    full, half, rest = lines(a), lines(b), lines(c)
    assert half[0] == full[0] == rest[0]
    assert full[1:] == half[1:] + rest[1:]


@test
def train_trace_ordinary_first_divergence():
    """Invariant vs ordinary on 2 micro-batches: every activation of step 0
    is the same bits (the forward and backward of each micro-batch do not
    depend on the reduction); the first divergence is the first weight
    gradient the backward produces, the LM head's, where the ordinary
    mode's fp32 sum over the micro-batches rounds differently. Two
    invariant layouts are identical."""
    a, o = tpath("tr_inv.trace"), tpath("tr_ord.trace")
    train_run("--steps", "2", "--trace", a, "--micro-batches", "2")
    train_run("--steps", "2", "--trace", o, "--micro-batches", "2", "--mode", "ordinary")
    rc, d = trace_diff(a, o)
    assert rc == 1 and not d["identical"], d
    first = d["first"]
    assert (first["step"], first["phase"], first["module"], first["what"]) == \
        (0, "backward", "lm_head.weight", "grad"), first
    key = lambda e: (e["step"], e["phase"], e["module"], e["what"], e["slice"])  # noqa: E731
    ea = {key(e): e for e in entries(a)[1]}
    eo = {key(e): e for e in entries(o)[1]}
    acts0 = [k for k in ea if k[0] == 0 and k[3] not in ("grad", "param")]
    assert len(acts0) > 100 and all(ea[k] == eo[k] for k in acts0)
    g0 = [k for k in ea if k[0] == 0 and k[3] == "grad"]
    assert sum(ea[k] != eo[k] for k in g0) > len(g0) // 2, "most gradients of step 0 should differ"


@test
def train_trace_planted_ulp_found():
    need_xxhash()
    key = "1/forward/model.norm/output/2"
    a, p = tpath("tr_clean.trace"), tpath("tr_plant.trace")
    train_run("--steps", "3", "--trace", a, "--dump", key)
    env = dict(os.environ, BITEXACT_TRACE_PLANT=key + "/7")
    rc, out, err = run("train", *FAST, "--json", "--steps", "3", "--trace", p, "--dump", key,
                       "--micro-batches", "2", env=env)
    assert rc == 0, err
    rc, d = trace_diff(a, p)
    assert rc == 1, d
    f = d["first"]
    assert (f["step"], f["phase"], f["module"], f["what"], f["slice"], f["element"], f["ulp"]) == \
        (1, "forward", "model.norm", "output", 2, 7, 1), f
    # the change goes on: the LM head's output of that sequence differs too
    assert any(m["module"] == "lm_head" for m in d["modules"]), d["modules"]
    # the dump: that entry's values, one element one ULP apart
    from safetensors.numpy import load_file
    x, y = load_file(a + ".dump.safetensors")[key], load_file(p + ".dump.safetensors")[key]
    assert x.shape == (16, 128) and x.dtype == np.float32
    diff = np.flatnonzero(x.view(np.uint32).ravel() != y.view(np.uint32).ravel())
    assert diff.tolist() == [7], diff
    assert np.nextafter(x.ravel()[7], np.float32(np.inf)) == y.ravel()[7]
    _, ea = entries(a)
    e = [e for e in ea if (e["step"], e["phase"], e["module"], e["slice"]) == (1, "forward", "model.norm", 2)][0]
    assert e["hash"] == xxhash.xxh3_64_hexdigest(x.tobytes())


@test
def train_trace_errors():
    f = tpath("tr_err.trace")
    from cases_train import expect_train_error
    expect_train_error(*FAST, "--steps", "1", "--dump", "0/forward/model/output/0",
                       needles=("--dump", "--trace"))
    expect_train_error(*FAST, "--steps", "1", "--trace", tpath("no_such_dir/x.trace"),
                       needles=("--trace",), outputs=False)
    env = dict(os.environ, BITEXACT_TRACE_PLANT="0/forward/model.norm/output/x")
    rc, out, err = run("train", *FAST, "--steps", "1", "--trace", f, env=env)
    assert rc == 2 and "BITEXACT_TRACE_PLANT" in err and len(err.strip().splitlines()) == 1, err
