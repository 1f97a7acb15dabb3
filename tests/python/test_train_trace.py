"""``python -m bitexact.train --trace`` (issue 28 item 2, docs/trace.md):
the torch and the Paddle trainer write the trace of `bitexact train
--trace`, byte for byte, on 1 process (1 and 2 micro-batches), 2
data-parallel processes and 2 processes with expert parallelism, with the
grid history on and off (off: every step runs two passes, so the first
pass's entries must be dropped); --dump writes the same values as the C
trainer's; --dump without --trace is refused with one line."""
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_train_bindings import CLI, launch  # noqa: E402

pytestmark = pytest.mark.skipif(not os.access(CLI, os.X_OK), reason=f"{CLI} is not built")
STEPS = 3
FLAGS = ("--seq-len", "16", "--global-batch", "4")
KEY = "1/backward/model.layers.1.mlp/grad_input.0/3"


def _run(cmd, env=None):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, PADDLE_DISTRI_BACKEND="gloo", OMP_NUM_THREADS="1",
                                **(env or {})))
    return p


@pytest.fixture(scope="module")
def cref(tmp_path_factory):
    d = tmp_path_factory.mktemp("ctrace")
    ck0 = str(d / "ck0")
    assert _run([CLI, "train", "--steps", "0", "--save", ck0, "-q", *FLAGS]).returncode == 0
    out = {"ck0": ck0}
    for hist in ("on", "off"):
        tr = str(d / f"c_{hist}.trace")
        p = _run([CLI, "train", "--steps", str(STEPS), "--trace", tr, "--dump", KEY, "-q",
                  "--grid-history", hist, *FLAGS])
        assert p.returncode == 0, p.stderr
        with open(tr, "rb") as f:
            out[hist] = f.read()
        out[hist + "_dump"] = tr + ".dump.safetensors"
    return out


def _py(fw, ranks, out, ck0, *extra):
    tr = os.path.join(out, "py.trace")
    launch(fw, ranks, out, ["--framework", fw, "--resume", ck0, "--steps", str(STEPS), "--trace",
                            tr, "--threads", "1", "-q", *extra])
    return tr


LAYOUTS = [pytest.param(1, (), id="1proc"),
           pytest.param(1, ("--micro-batches", "2", "--grid-history", "off"), id="1proc-mb2-twopass"),
           pytest.param(2, ("--micro-batches", "2"), id="dp2-mb2"),
           pytest.param(2, ("--ep", "2"), id="ep2")]


@pytest.mark.parametrize("ranks,extra", LAYOUTS)
@pytest.mark.parametrize("fw", ["torch", "paddle"])
def test_trainer_trace_is_bitexact_trains(cref, tmp_path, fw, ranks, extra):
    if fw == "paddle":
        pytest.importorskip("paddle")
    hist = "off" if "off" in extra else "on"
    dump = ("--dump", KEY) if ranks == 1 else ()
    tr = _py(fw, ranks, str(tmp_path), cref["ck0"], *extra, *dump)
    with open(tr, "rb") as f:
        got = f.read()
    assert got.count(b"\n") > 100
    assert got == cref[hist], subprocess.run([CLI, "diff", "--trace", tr, "/dev/stdin"],
                                             input=cref[hist], capture_output=True).stdout[:2000]
    if dump:
        from safetensors.numpy import load_file
        a, b = load_file(tr + ".dump.safetensors"), load_file(cref[hist + "_dump"])
        assert list(a) == [KEY] and list(b) == [KEY]
        assert a[KEY].shape == (16, 128) and a[KEY].tobytes() == b[KEY].tobytes()


def test_dump_needs_trace(cref, tmp_path):
    p = _run([sys.executable, "-m", "bitexact.train", "--framework", "torch", "--resume",
              cref["ck0"], "--steps", "1", "--dump", KEY, "-q"])
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and "--dump" in lines[0] and "--trace" in lines[0], \
        p.stderr
