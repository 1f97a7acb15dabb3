"""Restarts across trainers and layouts (issue 29 items 3 and 4;
docs/restart.md): a checkpoint `bitexact train` saved at step K under
`mpirun -np 4 --ep 4` resumes in the torch trainer on 2 gloo ranks with
--ep 2 and in the Paddle trainer on 1 process; a torch-saved checkpoint
resumes in the C trainer on -np 4 --ep 4. Each gives the straight C run's
record lines K.. byte for byte, its checkpoint's tensor hashes and its
trainer_state.json / config.json bytes. And the Python trainer's
checkpoint writer killed at every point (the test hook, and right after
any rename it makes) leaves DIR holding a complete checkpoint, the old or
the new."""
import glob
import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_train_bindings import launch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CLI = os.environ.get("BITEXACT_CLI", os.path.join(ROOT, "build", "bitexact"))
FAST = ["--seq-len", "16", "--global-batch", "4"]
STEPS, K = 4, 2

pytestmark = pytest.mark.skipif(not os.access(CLI, os.X_OK),
                                reason=f"the bitexact command is not built ({CLI})")


def _run(cmd, env=None, timeout=600):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, **(env or {})))


def _mpirun(np_, *args):
    mp = shutil.which("mpirun")
    if not mp:
        pytest.skip("no mpirun")
    cmd = [mp, "--oversubscribe", "-np", str(np_)]
    if os.geteuid() == 0:
        cmd.insert(1, "--allow-run-as-root")
    p = _run(cmd + [CLI, "train", *FAST, "-q", *map(str, args)])
    assert p.returncode == 0, p.stderr[-2000:]


def _hash(path):
    p = _run([CLI, "hash", "--json", path])
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)["checkpoint"]


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def c_np4(tmp_path_factory):
    """The C trainer on -np 4 --ep 4: the straight run's record and
    checkpoint, its checkpoint after K steps, and the initial model."""
    d = tmp_path_factory.mktemp("np4")
    rec, ck, ckk, ck0 = (str(d / "straight.jsonl"), str(d / "straight"), str(d / "ck_k"),
                         str(d / "ck0"))
    _mpirun(4, "--ep", 4, "--steps", STEPS, "--record", rec, "--save", ck)
    _mpirun(4, "--ep", 4, "--steps", K, "--save", ckk)
    p = _run([CLI, "train", *FAST, "-q", "--steps", "0", "--save", ck0])
    assert p.returncode == 0, p.stderr
    return dict(rec=rec, ck=ck, ckk=ckk, ck0=ck0)


def _py(fw, ranks, out, resume, steps):
    rec, ck = os.path.join(out, "r.jsonl"), os.path.join(out, "ck")
    launch(fw, ranks, out, ["--framework", fw, "--resume", resume, "--steps", str(steps),
                            "--record", rec, "--save", ck, "--threads", "1", "-q"]
           + (["--ep", str(ranks)] if ranks > 1 else []))
    return rec, ck


def _lines(p):
    with open(p, "rb") as f:
        return f.read().splitlines(keepends=True)


def _same_final(ck, ref):
    for f in ("model.safetensors", "optimizer/optimizer.safetensors"):
        assert _hash(os.path.join(ck, f)) == _hash(os.path.join(ref, f)), f
    for f in ("trainer_state.json", "config.json"):
        with open(os.path.join(ck, f), "rb") as x, open(os.path.join(ref, f), "rb") as y:
            assert x.read() == y.read(), f


@pytest.mark.parametrize("fw,ranks", [pytest.param("torch", 2, id="torch-ep2"),
                                      pytest.param("paddle", 1, id="paddle-1proc")])
def test_python_resumes_c_np4_ep4_checkpoint(c_np4, tmp_path, fw, ranks):
    if fw == "paddle":
        pytest.importorskip("paddle")
    else:
        pytest.importorskip("torch")
    rec, ck = _py(fw, ranks, str(tmp_path), c_np4["ckk"], STEPS)
    assert _lines(rec) == _lines(c_np4["rec"])[K:]
    _same_final(ck, c_np4["ck"])


def test_c_np4_ep4_resumes_torch_checkpoint(c_np4, tmp_path):
    pytest.importorskip("torch")
    _, tck = _py("torch", 1, str(tmp_path), c_np4["ck0"], K)
    rec, ck = str(tmp_path / "c.jsonl"), str(tmp_path / "c_ck")
    _mpirun(4, "--ep", 4, "--resume", tck, "--steps", STEPS, "--record", rec, "--save", ck)
    assert _lines(rec) == _lines(c_np4["rec"])[K:]
    for root, _, names in os.walk(c_np4["ck"]):  # the C writer: every file byte for byte
        for n in names:
            p = os.path.join(root, n)
            with open(p, "rb") as x, open(os.path.join(ck, os.path.relpath(p, c_np4["ck"])), "rb") as y:
                assert x.read() == y.read(), n


# ---- the Python writer killed at every point ----------------------------------------

_WRITER = textwrap.dedent("""
    import os, signal, sys
    import numpy as np
    from bitexact.train import _run
    d, tag, how = sys.argv[1], sys.argv[2], sys.argv[3]
    model = {"w": np.full((4, 4), float(len(tag)), dtype=np.float32)}
    opt = {"w.exp_avg": np.zeros((4, 4), np.float32), "w.exp_avg_sq": np.zeros((4, 4), np.float32)}
    if how == "rename":  # SIGKILL right after the first rename that succeeds
        real = os.rename
        def rename(a, b):
            real(a, b)
            os.kill(os.getpid(), signal.SIGKILL)
        os.rename = rename
    _run.write_checkpoint(d, "{}\\n", {"step": len(tag), "tag": tag}, model, opt)
""")

POINTS = ("tmpdir", "config", "model", "optimizer", "state", "synced", "renamed", "done", "rename")


@pytest.mark.parametrize("point", POINTS)
def test_writer_killed_leaves_a_complete_checkpoint(tmp_path, point):
    pytest.importorskip("safetensors")
    script = tmp_path / "w.py"
    script.write_text(_WRITER)
    d = str(tmp_path / "D")
    p = _run([sys.executable, str(script), d, "old", "none"])
    assert p.returncode == 0, p.stderr
    env = {"BITEXACT_TEST_CKPT_KILL": point} if point != "rename" else {}
    p = _run([sys.executable, str(script), d, "newer", point if point == "rename" else "none"],
             env=env)
    killed = p.returncode == -9
    assert killed or point == "rename", (point, p.returncode, p.stderr)
    assert os.path.isdir(d), f"{point}: no checkpoint directory after the kill"
    with open(os.path.join(d, "trainer_state.json")) as f:
        tag = json.load(f)["tag"]
    new = point in ("renamed", "done", "rename")
    assert tag == ("newer" if new else "old"), (point, tag)
    import safetensors.numpy as sn
    w = sn.load_file(os.path.join(d, "model.safetensors"))["w"]
    assert float(w[0, 0]) == len(tag)
    assert os.path.isfile(os.path.join(d, "optimizer", "optimizer.safetensors"))
    # the next save removes what the killed one left
    p = _run([sys.executable, str(script), d, "newest", "none"])
    assert p.returncode == 0, p.stderr
    assert not glob.glob(d + ".tmp-*") and not glob.glob(d + ".old-*"), os.listdir(tmp_path)
