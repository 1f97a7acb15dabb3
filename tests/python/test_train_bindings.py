"""The GLM-4.5 model of bitexact.torch and bitexact.paddle against `bitexact
train` (issue 16; docs/train_python.md): ``python -m bitexact.train``
resumes the C trainer's step-0 checkpoint of the tiny config on the
synthetic corpus and trains 10 steps; the run record must be
byte-identical to the C trainer's and the checkpoint's model and
optimizer files must have its ``bitexact hash`` (trainer_state.json and
config.json byte-identical), on 1 process (1 and 4 micro-batches), 2
data-parallel processes, and 2 processes with expert parallelism (--ep 2).
Then bad input through the trainer and the model loader."""
import json
import os
import shutil
import socket
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CLI = os.environ.get("BITEXACT_CLI", os.path.join(ROOT, "build", "bitexact"))
STEPS = 10

pytestmark = pytest.mark.skipif(not os.access(CLI, os.X_OK),
                                reason=f"the bitexact command is not built ({CLI}; "
                                       "scripts/test.sh builds it before this stage)")


def _run(cmd, env=None, timeout=600):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                       env=dict(os.environ, **(env or {})))
    return p


def _hash(path):
    p = _run([CLI, "hash", "--json", path])
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)["checkpoint"]


def _train_script():
    import bitexact.scripts
    return bitexact.scripts.TRAIN


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _c_ref(d, dtype):
    """The C trainer: the step-0 checkpoint, and 10 steps' record and checkpoint."""
    ck0, ck = str(d / "ck0"), str(d / "ck10")
    flags = ["--compute-dtype", dtype, "-q"]
    p = _run([CLI, "train", "--steps", "0", "--save", ck0, *flags])
    assert p.returncode == 0, p.stderr
    rec = str(d / "c.jsonl")
    p = _run([CLI, "train", "--steps", str(STEPS), "--record", rec, "--save", ck, "--threads", "1",
              *flags])
    assert p.returncode == 0, p.stderr
    return dict(ck0=ck0, ck=ck, rec=rec, dir=d)


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    return _c_ref(tmp_path_factory.mktemp("cref"), "fp32")


@pytest.fixture(scope="module")
def ref_bf16(tmp_path_factory):
    return _c_ref(tmp_path_factory.mktemp("cref_bf16"), "bf16")


def _py_train(fw, ranks, out, ck0, *extra, steps=STEPS):
    """python -m bitexact.train on `ranks` processes; returns (record, ckpt)."""
    rec, ck = os.path.join(out, "r.jsonl"), os.path.join(out, "ck")
    launch(fw, ranks, out, ["--framework", fw, "--resume", ck0, "--steps", str(steps), "--record",
                            rec, "--save", ck, "--threads", "1", "-q", *extra])
    return rec, ck


def launch(fw, ranks, out, args):
    """python -m bitexact.train ARGS on `ranks` processes (torch.distributed.run
    or paddle.distributed.launch over gloo; logs under out/log); asserts exit 0."""
    if ranks == 1:
        cmd = [sys.executable, "-m", "bitexact.train", *args]
    elif fw == "torch":
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks),
               "--master-addr", "127.0.0.1", "--master-port", str(_port()), "-m",
               "bitexact.train", *args]
    else:
        cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node",
               str(ranks), "--log_dir", os.path.join(out, "log"),
               _train_script(), *args]
    p = _run(cmd, env={"PADDLE_DISTRI_BACKEND": "gloo", "OMP_NUM_THREADS": "1"})
    logs = ""
    if os.path.isdir(os.path.join(out, "log")):
        logs = "".join(open(os.path.join(out, "log", f)).read()[-2000:]
                       for f in sorted(os.listdir(os.path.join(out, "log"))))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:] + logs


def _same_run(ref, rec, ck):
    with open(rec, "rb") as f, open(ref["rec"], "rb") as g:
        a, b = f.read(), g.read()
    assert a.count(b"\n") == STEPS and a == b, (a.decode()[:600], b.decode()[:600])
    for f in ("model.safetensors", "optimizer/optimizer.safetensors"):
        assert _hash(os.path.join(ck, f)) == _hash(os.path.join(ref["ck"], f)), f
    for f in ("trainer_state.json", "config.json"):
        with open(os.path.join(ck, f), "rb") as x, open(os.path.join(ref["ck"], f), "rb") as y:
            assert x.read() == y.read(), f


LAYOUTS = [  # (ranks, extra flags)
    pytest.param(1, (), id="1proc"),
    pytest.param(1, ("--micro-batches", "4"), id="1proc-mb4"),
    pytest.param(2, ("--micro-batches", "2"), id="dp2-mb2"),
    pytest.param(2, ("--ep", "2"), id="ep2"),
]


@pytest.mark.parametrize("ranks,extra", LAYOUTS)
@pytest.mark.parametrize("fw", ["torch", "paddle"])
def test_binding_run_equals_bitexact_train(ref, tmp_path, fw, ranks, extra):
    if fw == "paddle":
        pytest.importorskip("paddle")
    rec, ck = _py_train(fw, ranks, str(tmp_path), ref["ck0"], *extra)
    _same_run(ref, rec, ck)


@pytest.mark.parametrize("ranks,extra", [pytest.param(1, ("--micro-batches", "4"), id="1proc-mb4"),
                                         pytest.param(2, ("--ep", "2", "--micro-batches", "2"),
                                                      id="ep2-mb2")])
@pytest.mark.parametrize("fw", ["torch", "paddle"])
def test_bf16_compute_equals_bitexact_train(ref, ref_bf16, tmp_path, fw, ranks, extra):
    """--compute-dtype bf16 (bf16 GEMM operands, fp32 accumulation and master
    weights): the bindings round every operand as tr_bf16_round and give
    the C trainer's bf16 bits, which differ from the fp32 run's."""
    if fw == "paddle":
        pytest.importorskip("paddle")
    rec, ck = _py_train(fw, ranks, str(tmp_path), ref_bf16["ck0"], *extra)
    _same_run(ref_bf16, rec, ck)
    with open(rec, "rb") as f, open(ref["rec"], "rb") as g:
        assert f.read() != g.read()


def test_resume_across_frameworks_and_the_c_trainer(ref, tmp_path):
    """torch trains steps 0-4, Paddle resumes its checkpoint for 5-9, the C
    trainer resumes Paddle's for 10-11: the records concatenate to the C
    trainer's straight run (so the checkpoints the bindings write are
    complete and `bitexact train --resume` accepts them)."""
    pytest.importorskip("paddle")
    a = tmp_path / "a"
    b = tmp_path / "b"
    a.mkdir()
    b.mkdir()
    r1, c1 = _py_train("torch", 1, str(a), ref["ck0"], steps=5)
    r2, c2 = _py_train("paddle", 1, str(b), c1, steps=STEPS)
    with open(r1, "rb") as f, open(r2, "rb") as g, open(ref["rec"], "rb") as h:
        assert f.read() + g.read() == h.read()
    r3 = str(tmp_path / "c.jsonl")
    p = _run([CLI, "train", "--resume", c2, "--steps", "12", "--record", r3, "-q"])
    assert p.returncode == 0, p.stderr
    r4 = str(tmp_path / "d.jsonl")
    p = _run([CLI, "train", "--resume", ref["ck"], "--steps", "12", "--record", r4, "-q"])
    assert p.returncode == 0, p.stderr
    with open(r3, "rb") as f, open(r4, "rb") as g:
        assert f.read() == g.read()


# ---- bad input -------------------------------------------------------------------

@pytest.mark.parametrize("flags,needle", [
    (("--seq-len", "32"), "--seq-len is 32 here but 64"),
    (("--global-batch", "6"), "--global-batch is 6 here but 8"),
    (("--micro-batches", "3"), "--micro-batches 3"),
    (("--ep", "3"), "--ep 3"),
    (("--steps", "-1"), "--steps -1 is before"),
    (("--compute-dtype", "bf16"), "--compute-dtype is bf16 here but fp32"),
])
def test_bad_flags_exit_2_with_one_line(ref, tmp_path, flags, needle):
    out = str(tmp_path / "ck")
    p = _run([sys.executable, "-m", "bitexact.train", "--framework", "torch", "--resume",
              ref["ck0"], "--save", out, *flags])
    assert p.returncode == 2, p.stderr
    assert needle in p.stderr and p.stderr.count("\n") == 1, p.stderr
    assert not os.path.exists(out)


def test_missing_checkpoint_file(ref, tmp_path):
    d = str(tmp_path / "ck")
    shutil.copytree(ref["ck0"], d)
    os.remove(os.path.join(d, "optimizer", "optimizer.safetensors"))
    p = _run([sys.executable, "-m", "bitexact.train", "--framework", "torch", "--resume", d])
    assert p.returncode == 2 and "optimizer.safetensors is missing" in p.stderr, p.stderr


def test_save_refuses_a_directory_with_other_files(ref, tmp_path):
    d = tmp_path / "ck"
    d.mkdir()
    (d / "keep.txt").write_text("mine")
    rec = tmp_path / "r.jsonl"
    p = _run([sys.executable, "-m", "bitexact.train", "--framework", "torch", "--resume",
              ref["ck0"], "--steps", "1", "--save", str(d), "--record", str(rec)])
    assert p.returncode == 2 and "other files" in p.stderr, p.stderr
    assert not rec.exists()  # refused before the run: no step, no record
    assert (d / "keep.txt").read_text() == "mine" and sorted(os.listdir(d)) == ["keep.txt"]


@pytest.mark.parametrize("fw", ["torch", "paddle"])
def test_load_checkpoint_checks_everything_first(ref, fw):
    """A wrong shape, a missing and an extra tensor are refused naming the
    tensor; nothing is copied (the parameters keep their values)."""
    import numpy as np
    from safetensors.numpy import load_file
    import bitexact
    if fw == "paddle":
        pytest.importorskip("paddle")
        from bitexact.paddle import Glm4MoeForCausalLM

        def value(p):
            return p.numpy()
    else:
        from bitexact.torch import Glm4MoeForCausalLM

        def value(p):
            return p.detach().numpy()
    arrays = load_file(os.path.join(ref["ck0"], "model.safetensors"))
    m = Glm4MoeForCausalLM(os.path.join(ref["ck0"], "config.json"))
    before = {n: np.array(value(p)) for n, p in m.named_parameters()}
    name = "model.layers.1.mlp.experts.3.up_proj.weight"
    bad = dict(arrays)
    bad[name] = arrays[name][:, :-1].copy()
    bad2 = {k: v for k, v in arrays.items() if k != "lm_head.weight"}
    bad3 = dict(arrays, extra=np.zeros(3, np.float32))
    for t, needle in ((bad, name), (bad2, "lm_head.weight"), (bad3, "extra")):
        with pytest.raises(bitexact.InvalidArgumentError, match=needle.replace(".", r"\.")):
            m.load_checkpoint(t)
        for n, p in m.named_parameters():
            assert np.array_equal(before[n], value(p)), n
    m.load_checkpoint(arrays)
    for n, p in m.named_parameters():
        assert np.array_equal(arrays[n], value(p)), n


# ---- the negative control: native ops ---------------------------------------------

def test_native_ops_move_with_the_layout(ref, tmp_path):
    """transformers' own Glm4MoeForCausalLM with torch's autograd,
    clip_grad_norm_ and AdamW (bench/python/glm_native.py), from the same
    checkpoint and data: its parameters after 3 steps differ between 1 and
    4 micro-batches and from `bitexact train`'s, while its losses agree
    with `bitexact train`'s to fp32 accuracy (rel. 1e-5). The Paddle-native
    counterpart (torch vs Paddle native ops differ) is
    test_paddle_layers.py::test_native_frameworks_differ."""
    pytest.importorskip("transformers")
    import numpy as np
    from safetensors.numpy import load_file
    sys.path.insert(0, os.path.join(ROOT, "bench", "python"))
    import glm_native
    ck3 = str(tmp_path / "ck3")
    p = _run([CLI, "train", "--steps", "3", "--save", ck3, "-q"])
    assert p.returncode == 0, p.stderr
    c3 = load_file(os.path.join(ck3, "model.safetensors"))
    with open(ref["rec"]) as f:
        c_loss = [float.fromhex(json.loads(line)["loss"]) for line in f][:3]
    runs = {}
    for M in (1, 4):
        r = glm_native.NativeRun(ref["ck0"], M)
        losses = [float(r.step(s)[0]) for s in range(3)]
        assert all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(losses, c_loss)), (losses, c_loss)
        sd = {n: t.detach().numpy().copy() for n, t in r.model.named_parameters()}
        runs[M] = sd
    differ = [n for n in runs[1] if not np.array_equal(runs[1][n].view(np.uint32),
                                                       runs[4][n].view(np.uint32))]
    assert differ, "native ops gave the same bits for 1 and 4 micro-batches"
    vs_c = [n for n in ("lm_head.weight", "model.embed_tokens.weight", "model.norm.weight")
            if not np.array_equal(runs[1][n].view(np.uint32), c3[n].view(np.uint32))]
    assert vs_c, "native ops gave bitexact train's bits"
    print(f"native: {len(differ)} of {len(runs[1])} tensors differ between 1 and 4 micro-batches;"
          f" {len(vs_c)} of 3 checked differ from bitexact train")


def test_native_paddle_differs_from_native_torch_and_moves_with_the_layout(ref):
    """The same model with Paddle's own eager ops (bench/python/
    glm_native_paddle.py: transformers' formula in Paddle, ClipGradByGlobalNorm,
    paddle.optimizer.AdamW) from the same checkpoint and data: after 3 steps
    its parameters differ from the torch-native run's (transformers) and
    between 1 and 4 micro-batches, and its losses agree with `bitexact
    train`'s to fp32 accuracy (rel. 1e-5) — where the bindings give one set
    of bits for both frameworks and every layout."""
    pytest.importorskip("paddle")
    pytest.importorskip("transformers")
    import numpy as np
    sys.path.insert(0, os.path.join(ROOT, "bench", "python"))
    import glm_native
    import glm_native_paddle
    with open(ref["rec"]) as f:
        c_loss = [float.fromhex(json.loads(line)["loss"]) for line in f][:3]
    pd = {}
    for M in (1, 4):
        r = glm_native_paddle.NativeRun(ref["ck0"], M)
        losses = [float(r.step(s)) for s in range(3)]
        assert all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(losses, c_loss)), (losses, c_loss)
        pd[M] = {n: np.array(t.numpy()) for n, t in r.p.items()}
    t = glm_native.NativeRun(ref["ck0"], 1)
    for s in range(3):
        t.step(s)
    tn = {n: p.detach().numpy() for n, p in t.model.named_parameters()}

    def bits(a):
        return np.ascontiguousarray(a).view(np.uint32)
    names = ["lm_head.weight", "model.embed_tokens.weight", "model.layers.0.mlp.up_proj.weight",
             "model.layers.0.self_attn.q_proj.weight", "model.norm.weight"]
    vs_torch = [n for n in names if not np.array_equal(bits(pd[1][n]), bits(tn[n]))]
    vs_layout = [n for n in pd[1] if not np.array_equal(bits(pd[1][n]), bits(pd[4][n]))]
    assert vs_torch and vs_layout, (vs_torch, vs_layout)
    print(f"native Paddle: {len(vs_torch)} of {len(names)} checked tensors differ from native torch;"
          f" {len(vs_layout)} of {len(pd[1])} differ between 1 and 4 micro-batches")


def test_torch_compile_runs_a_step_with_the_same_bits(ref):
    """torch.compile(model) (default mode, the user's own call): the layers
    are bitexact's custom ops (torch/_compile.py), inductor compiles the
    torch code between them; the record lines equal `bitexact train`'s."""
    import warnings
    import torch
    from bitexact.train import _run as g
    from bitexact.torch._glm import RUNNER
    a = g.parse_args(["--framework", "torch", "--resume", ref["ck0"], "--steps", "2",
                      "--threads", "1"])
    r = g.Run(a, RUNNER)
    from bitexact.torch import _compile as tc
    r.forward = torch.compile(r.model)
    before = next(tc._COUNT)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Dynamo's graph-break advice
        lines = [r.step(s) for s in range(2)]
    assert next(tc._COUNT) - before > 1  # the layers ran as the custom op
    assert not tc._RECORDS  # every recorded call's backward ran
    with open(ref["rec"]) as f:
        assert lines == f.read().splitlines()[:2]


@pytest.mark.parametrize("dtype,ranks,extra", [
    pytest.param("fp32", 1, ("--micro-batches", "4"), id="fp32-1proc-mb4"),
    pytest.param("fp32", 2, ("--ep", "2", "--micro-batches", "2"), id="fp32-ep2-mb2"),
    pytest.param("bf16", 1, ("--micro-batches", "4"), id="bf16-1proc-mb4"),
])
def test_torch_compile_fullgraph_equals_bitexact_train(ref, ref_bf16, tmp_path, dtype, ranks,
                                                       extra):
    """--compile: torch.compile(model, fullgraph=True) (one graph per
    forward, no graph break possible): 10 steps' record and checkpoint
    equal `bitexact train`'s, with micro-batches, expert parallelism over 2
    gloo ranks (the exchange inside the compiled op) and bf16 compute."""
    r = ref if dtype == "fp32" else ref_bf16
    rec, ck = _py_train("torch", ranks, str(tmp_path), r["ck0"], "--compile", *extra)
    _same_run(r, rec, ck)


def test_compile_is_torch_only(ref, tmp_path):
    pytest.importorskip("paddle")
    p = _run([sys.executable, "-m", "bitexact.train", "--framework", "paddle", "--resume",
              ref["ck0"], "--steps", "1", "--compile"])
    assert p.returncode != 0 and "--compile: not offered with --framework paddle" in p.stderr


@pytest.mark.parametrize("fw", ["torch", "paddle"])
def test_other_config_data_file_and_shuffle(tmp_path, fw):
    """A config with QK-norm, 2 MoE layers and routed scaling 2.5, a .npy
    token file, --shuffle, seq-len 32, global batch 4, 2 micro-batches:
    4 steps equal `bitexact train`'s (record and checkpoint)."""
    import numpy as np
    if fw == "paddle":
        pytest.importorskip("paddle")
    d = tmp_path
    p = _run([CLI, "train", "--steps", "0", "--save", str(d / "base"), "-q"])
    assert p.returncode == 0, p.stderr
    with open(d / "base" / "config.json") as f:
        cfg = json.load(f)
    cfg.update(use_qk_norm=True, num_hidden_layers=3, routed_scaling_factor=2.5, vocab_size=512)
    with open(d / "c.json", "w") as f:
        json.dump(cfg, f)
    np.save(d / "t.npy", np.random.default_rng(1).integers(0, 512, 20000).astype("<u2"))
    flags = ["--config", str(d / "c.json"), "--data", str(d / "t.npy"), "--shuffle", "--seq-len",
             "32", "--global-batch", "4", "-q"]
    ck0, ck, rec = str(d / "ck0"), str(d / "ck"), str(d / "c.jsonl")
    assert _run([CLI, "train", "--steps", "0", "--save", ck0, *flags]).returncode == 0
    p = _run([CLI, "train", "--steps", "4", "--save", ck, "--record", rec, *flags])
    assert p.returncode == 0, p.stderr
    out = d / "py"
    out.mkdir()
    r, c = _py_train(fw, 1, str(out), ck0, "--data", str(d / "t.npy"), "--micro-batches", "2",
                     steps=4)
    with open(r, "rb") as f, open(rec, "rb") as g:
        assert f.read() == g.read()
    for f in ("model.safetensors", "optimizer/optimizer.safetensors"):
        assert _hash(os.path.join(c, f)) == _hash(os.path.join(ck, f))


@pytest.mark.parametrize("fw", ["torch", "paddle"])
def test_model_bad_input_changes_nothing(ref, fw):
    """Float ids, an id or a label out of the vocabulary, labels of another
    shape: the framework-independent bitexact errors, naming the argument;
    after each, the same micro-batch still accepts the correct call (no
    weight or loss left registered), and the step finishes with the bits
    of a step that never saw the bad calls."""
    import numpy as np
    if fw == "paddle":
        pytest.importorskip("paddle")
        import paddle
        from bitexact.paddle import Glm4MoeForCausalLM, GradReduction

        def t(a, dt="int64"):
            return paddle.to_tensor(a, dtype=dt)
        f32 = "float32"
    else:
        import torch
        from bitexact.torch import Glm4MoeForCausalLM, GradReduction

        def t(a, dt=torch.int64):
            return torch.tensor(a, dtype=dt)
        f32 = torch.float32
    import bitexact
    from safetensors.numpy import load_file
    arrays = load_file(os.path.join(ref["ck0"], "model.safetensors"))
    ids = np.random.default_rng(3).integers(0, 1024, (2, 9))
    x, y = ids[:, :8], ids[:, 1:]
    bad = [((t(x, f32), t(y)), bitexact.DTypeError, "input"),
           ((t(x + 1024), t(y)), bitexact.InvalidArgumentError, "ids"),
           ((t(x), t(y + 1024)), bitexact.InvalidArgumentError, "target"),
           ((t(x), t(y[:, :4])), bitexact.InvalidArgumentError, "labels")]
    grads = []
    for with_bad in (True, False):
        m = Glm4MoeForCausalLM(os.path.join(ref["ck0"], "config.json"))
        m.load_checkpoint(arrays)
        red = GradReduction(list(m.named_parameters()), 8, 16)

        def run(i):
            if with_bad:
                for args, exc, needle in bad:
                    with pytest.raises(exc, match=needle):
                        m(*args)
            m(t(x), t(y)).backward()
        red.run_two_pass(run, [(0, 16)])
        grads.append([np.array(p.grad.numpy()) for _, p in m.named_parameters()])
    assert all(np.array_equal(a.view(np.uint32), b.view(np.uint32)) for a, b in zip(*grads))


SCHEDULE = ("--lr-scheduler", "cosine", "--warmup-steps", "3", "--min-lr", "1e-4",
            "--adam-beta1", "0.85", "--adam-beta2", "0.95", "--adam-epsilon", "1e-6")


@pytest.mark.parametrize("fw", ["torch", "paddle"])
def test_schedule_and_adam_flags_equal_bitexact_train(ref, tmp_path, fw):
    """--lr-scheduler/--warmup-steps/--min-lr/--adam-*: the same names in
    python -m bitexact.train, the same rates (bx_lr_at) in the record, the
    same checkpoint bytes (trainer_state.json included) as the C trainer."""
    if fw == "paddle":
        pytest.importorskip("paddle")
    d = tmp_path / "c"
    d.mkdir()
    crec, cck = str(d / "c.jsonl"), str(d / "ck")
    p = _run([CLI, "train", "--resume", ref["ck0"], "--steps", str(STEPS), "--record", crec,
              "--save", cck, "--threads", "1", "-q", *SCHEDULE])
    assert p.returncode == 0, p.stderr
    rec, ck = _py_train(fw, 1, str(tmp_path), ref["ck0"], *SCHEDULE)
    cref = dict(rec=crec, ck=cck)
    _same_run(cref, rec, ck)
    lrs = [float.fromhex(json.loads(l)["lr"]) for l in open(rec)]
    assert lrs[0] == 0.0 and lrs[3] == 1e-3 and lrs[-1] > 1e-4, lrs
    with open(rec, "rb") as f, open(ref["rec"], "rb") as g:
        assert f.read() != g.read()

def test_sharded_checkpoint_and_old_layout(ref, tmp_path):
    """--save-max-shard-size: python -m bitexact.train writes the C trainer's
    shards (each with its `bitexact hash`) and the same index bytes, and
    resumes a sharded C checkpoint and one of the old layout
    (optimizer.safetensors beside the model) into the C trainer's run."""
    cdir = str(tmp_path / "c")
    p = _run([CLI, "train", "--steps", "3", "--save", cdir, "--save-max-shard-size", "300KB",
              "--threads", "1", "-q"])
    assert p.returncode == 0, p.stderr
    os.makedirs(tmp_path / "py")
    rec, ck = _py_train("torch", 1, str(tmp_path / "py"), ref["ck0"], "--save-max-shard-size",
                        "300KB", steps=3)
    files = sorted(os.listdir(cdir))
    assert files == sorted(os.listdir(ck)) and "model.safetensors.index.json" in files
    for f in files:
        if f.startswith("model-"):
            assert _hash(os.path.join(ck, f)) == _hash(os.path.join(cdir, f)), f
    for f in ("model.safetensors.index.json", "trainer_state.json", "config.json"):
        with open(os.path.join(ck, f), "rb") as x, open(os.path.join(cdir, f), "rb") as y:
            assert x.read() == y.read(), f
    assert _hash(os.path.join(ck, "optimizer", "optimizer.safetensors")) == \
        _hash(os.path.join(cdir, "optimizer", "optimizer.safetensors"))
    # resume the sharded C checkpoint, and the old layout, to the C run's end
    old = str(tmp_path / "old")
    p = _run([CLI, "train", "--steps", "3", "--save", old, "--threads", "1", "-q"])
    assert p.returncode == 0, p.stderr
    os.rename(os.path.join(old, "optimizer", "optimizer.safetensors"),
              os.path.join(old, "optimizer.safetensors"))
    os.rmdir(os.path.join(old, "optimizer"))
    with open(ref["rec"]) as f:
        want = f.read().splitlines()[3:]
    for src in (cdir, old):
        out = tmp_path / ("r_" + os.path.basename(src))
        os.makedirs(out)
        rec2, ck2 = _py_train("torch", 1, str(out), src)
        with open(rec2) as f:
            assert f.read().splitlines() == want, src
        assert _hash(os.path.join(ck2, "model.safetensors")) == \
            _hash(os.path.join(ref["ck"], "model.safetensors"))


def test_init_from_as_the_c_trainer(ref, tmp_path):
    """--init-from a BF16 sharded folder with a PaddleFormers-style
    config.json (extra keys): python -m bitexact.train gives the C
    trainer's records, checkpoint tensors (bitexact hash), trainer_state.json
    and config.json bytes; bad folders are one line, exit 2."""
    import torch
    from safetensors.torch import load_file, save_file
    src = tmp_path / "bf16"
    os.makedirs(src)
    t = {n: v.to(torch.bfloat16) for n, v in load_file(os.path.join(ref["ck0"], "model.safetensors")).items()}
    names = sorted(t)
    wm = {}
    for k, part in enumerate((names[:25], names[25:])):
        f = f"model-{k + 1:05d}-of-00002.safetensors"
        save_file({n: t[n] for n in part}, str(src / f))
        wm.update({n: f for n in part})
    (src / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    with open(os.path.join(ref["ck0"], "config.json")) as f:
        cfg = json.load(f)
    cfg.update(fuse_rms_norm=False, paddleformers_version="1.2.0", scoring_func="sigmoid",
               topk_method="noaux_tc")
    del cfg["head_dim"]
    (src / "config.json").write_text(json.dumps(cfg))
    cdir, crec = str(tmp_path / "c"), str(tmp_path / "c.jsonl")
    flags = ["--steps", "3", "--seq-len", "16", "--global-batch", "4", "--seed", "5", "--lr", "0.002"]
    p = _run([CLI, "train", "--init-from", str(src), "--record", crec, "--save", cdir, "--threads",
              "1", "-q", *flags])
    assert p.returncode == 0, p.stderr
    out = tmp_path / "py"
    os.makedirs(out)
    rec, ck = os.path.join(out, "r.jsonl"), os.path.join(out, "ck")
    p = _run([sys.executable, "-m", "bitexact.train", "--framework", "torch", "--init-from",
              str(src), "--record", rec, "--save", ck, "--threads", "1", "-q", *flags])
    assert p.returncode == 0, p.stderr
    with open(rec) as f, open(crec) as g:
        assert f.read() == g.read()
    for f in ("model.safetensors", "optimizer/optimizer.safetensors"):
        assert _hash(os.path.join(ck, f)) == _hash(os.path.join(cdir, f)), f
    for f in ("trainer_state.json", "config.json"):
        with open(os.path.join(ck, f), "rb") as x, open(os.path.join(cdir, f), "rb") as y:
            assert x.read() == y.read(), f
    # bad input: one line, exit 2
    bad = tmp_path / "bad"
    shutil.copytree(src, bad)
    os.remove(bad / "model-00002-of-00002.safetensors")
    for args, needle in ((["--init-from", str(bad)], "model-00002-of-00002.safetensors"),
                         (["--init-from", str(src), "--resume", ref["ck0"]], "--init-from"),
                         (["--init-from", str(tmp_path / "none")], "config.json")):
        p = _run([sys.executable, "-m", "bitexact.train", "--framework", "torch", "--steps", "1", *args])
        assert p.returncode == 2 and needle in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_sigterm_and_save_every_resume_bit_for_bit(ref, tmp_path):
    """python -m bitexact.train: SIGTERM mid-run finishes the step, saves,
    exits 0; --save-every K keeps the last complete multiple of K; resuming
    either gives the records of `bitexact train` run straight through."""
    import signal
    import time
    steps = 30
    d = tmp_path / "c"
    d.mkdir()
    crec = str(d / "c.jsonl")
    p = _run([CLI, "train", "--resume", ref["ck0"], "--steps", str(steps), "--record", crec,
              "--threads", "1", "-q", *SCHEDULE])
    assert p.returncode == 0, p.stderr
    want = open(crec).read().splitlines()
    for how in ("sigterm", "save-every"):
        rec, ck, rest = (str(tmp_path / f"{how}.jsonl"), str(tmp_path / f"{how}_ck"),
                         str(tmp_path / f"{how}_rest.jsonl"))
        extra = ["--save-every", "4"] if how == "save-every" else []
        q = subprocess.Popen([sys.executable, "-m", "bitexact.train", "--framework", "torch",
                              "--resume", ref["ck0"], "--steps", str(steps), "--record", rec,
                              "--save", ck, "--threads", "1", "-q", *SCHEDULE, *extra],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        t0 = time.time()
        while time.time() - t0 < 300 and q.poll() is None:
            if os.path.exists(rec) and open(rec).read().count("\n") >= 9:
                break
            time.sleep(0.05)
        q.send_signal(signal.SIGTERM if how == "sigterm" else signal.SIGKILL)
        out, err = q.communicate(timeout=300)
        if how == "sigterm":
            assert q.returncode == 0, (q.returncode, err)
        with open(os.path.join(ck, "trainer_state.json")) as f:
            k = json.load(f)["step"]
        got = open(rec).read().splitlines()
        if how == "sigterm":
            assert k == len(got) and 9 <= k < steps, (k, len(got))
        else:
            assert k % 4 == 0 and 8 <= k <= len(got), (k, len(got))
        assert got[:k] == want[:k]
        (tmp_path / f"{how}_r").mkdir()
        rec2, _ = _py_train("torch", 1, str(tmp_path / f"{how}_r"), ck, *SCHEDULE, steps=steps)
        assert open(rec2).read().splitlines() == want[k:], how


@pytest.mark.parametrize("fw,ranks,extra", [("torch", 1, ("--micro-batches", "2")),
                                            ("paddle", 1, ()),
                                            ("torch", 2, ("--ep", "2"))])
def test_eval_loss_equals_bitexact_train(ref, tmp_path, fw, ranks, extra):
    """--eval-data/--eval-every/--eval-batches in python -m bitexact.train:
    the same eval_loss bits in the record as `bitexact train`."""
    if fw == "paddle":
        pytest.importorskip("paddle")
    import numpy as np
    ev = str(tmp_path / "eval.npy")
    np.save(ev, np.random.default_rng(9).integers(0, 256, 3000).astype(np.int32))
    flags = ("--eval-data", ev, "--eval-every", "3", "--eval-batches", "2")
    d = tmp_path / "c"
    d.mkdir()
    crec = str(d / "c.jsonl")
    p = _run([CLI, "train", "--resume", ref["ck0"], "--steps", str(STEPS), "--record", crec,
              "--threads", "1", "-q", *flags])
    assert p.returncode == 0, p.stderr
    out = tmp_path / "py"
    out.mkdir()
    rec, _ = _py_train(fw, ranks, str(out), ref["ck0"], *flags, *extra)
    a, b = open(rec).read(), open(crec).read()
    assert a == b and a.count('"eval_loss"') == 4, (a[:800], b[:800])
