"""python -m bitexact.train: a failure on one rank reaches every rank
(issue 29 items 1 and 2; docs/faults.md). Two processes over gloo (torch's
torch.distributed.run, Paddle's paddle.distributed.launch), the tiny config
of `bitexact train --steps 0 --save`: BITEXACT_FAULT makes rank 1 fail at
one point of step 1; every rank must return 2 (a wrapper records each rank's
status: the launchers kill the other workers once one exits non-zero), within
the subprocess timeout (a hang fires it), one line names rank 1 and the cause,
the record has no line of the failed step and the checkpoint of the previous
--save-every is the step before. Then ranks started with different settings
(a per-rank argument through the wrapper) stop with one line naming the
setting. Kept to a few cases: each launch costs seconds."""
import os
import sys

import pytest

from test_train_bindings import CLI, _port, _run

pytestmark = pytest.mark.skipif(not os.access(CLI, os.X_OK), reason=f"{CLI} not built")

WRAPPER = """import os, sys
rank = int(os.environ.get("RANK", os.environ.get("PADDLE_TRAINER_ID", "0")))
argv = sys.argv[1:] + os.environ.get("FAULT_ARGS_%d" % rank, "").split()
from bitexact.train._run import main
rc = main(argv)
with open(os.environ["FAULT_STATUS"], "a") as f:
    f.write("%d %d\\n" % (rank, rc))
sys.exit(0)
"""


@pytest.fixture(scope="module")
def ck0(tmp_path_factory):
    d = tmp_path_factory.mktemp("faults")
    ck = str(d / "ck0")
    p = _run([CLI, "train", "--seq-len", "16", "--global-batch", "4", "--steps", "0", "--save", ck, "-q"])
    assert p.returncode == 0, p.stderr
    rec = str(d / "c.jsonl")
    p = _run([CLI, "train", "--seq-len", "16", "--global-batch", "4", "--steps", "3", "--record", rec, "-q"])
    assert p.returncode == 0, p.stderr
    with open(rec) as f:
        return ck, f.read().splitlines()


def _launch(fw, out, args, env):
    script = os.path.join(out, "wrap.py")
    with open(script, "w") as f:
        f.write(WRAPPER)
    status = os.path.join(out, "status")
    if fw == "torch":
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
               "--master-addr", "127.0.0.1", "--master-port", str(_port()), script]
    else:
        cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "2",
               "--log_dir", os.path.join(out, "log"), script]
    p = _run(cmd + ["--framework", fw, *args], timeout=120,
             env=dict(env, FAULT_STATUS=status, PADDLE_DISTRI_BACKEND="gloo", OMP_NUM_THREADS="1"))
    logs = p.stdout + p.stderr
    if os.path.isdir(os.path.join(out, "log")):
        logs += "".join(open(os.path.join(out, "log", f)).read() for f in sorted(os.listdir(os.path.join(out, "log"))))
    with open(status) as f:
        st = sorted(tuple(map(int, l.split())) for l in f if l.strip())
    return st, [l for l in logs.splitlines() if "bitexact.train: " in l], logs


CAUSE = {"kernel": "the routed experts", "data": "outside [0, 1024)", "loss": "non-finite loss",
         "save": "--save"}


# kept to a few cases (the points are framework-neutral: torch takes every one, Paddle two)
CASES = [("torch", p, 1) for p in ("kernel", "data", "loss", "save")] + [("torch", "kernel", 2)] + \
    [("paddle", "kernel", 1), ("paddle", "save", 1), ("paddle", "kernel", 2)]


@pytest.mark.parametrize("fw,point,ep", CASES)
def test_fault_reaches_every_rank(ck0, tmp_path, fw, point, ep):
    if fw == "paddle":
        pytest.importorskip("paddle")
    ck, ref = ck0
    out = str(tmp_path)
    rec, save = os.path.join(out, "r.jsonl"), os.path.join(out, "ck")
    st, lines, logs = _launch(fw, out, ["--resume", ck, "--steps", "3", "--threads", "1", "-q",
                                        "--record", rec, "--save", save, "--save-every", "1",
                                        "--ep", str(ep)],
                              {"BITEXACT_FAULT": f"1:1:{point}"})
    assert st == [(0, 2), (1, 2)], (st, logs[-3000:])
    mine = sorted(set(lines))
    assert len(mine) == 1 and "bitexact.train: rank 1: " in mine[0] and CAUSE[point] in mine[0], logs[-3000:]
    with open(rec) as f:
        got = f.read().splitlines()
    assert got == ref[:2 if point == "save" else 1]
    with open(os.path.join(save, "trainer_state.json")) as f:
        assert '"step": 1' in f.read()


def test_eval_fault_under_ep_reaches_every_rank(ck0, tmp_path):
    """Rank 1 fails in the eval after its first micro-batch's forward while
    its EP peer goes on to the next forward's row exchange: its status step
    drains the peer, every rank returns 2."""
    import numpy as np
    ck, _ = ck0
    out = str(tmp_path)
    ev, rec = os.path.join(out, "eval.npy"), os.path.join(out, "r.jsonl")
    np.save(ev, ((np.arange(4 * 17 * 2) * 7) % 1024).astype(np.int32))
    st, lines, logs = _launch("torch", out, ["--resume", ck, "--steps", "3", "--threads", "1", "-q",
                                             "--record", rec, "--ep", "2", "--eval-data", ev,
                                             "--eval-every", "1", "--micro-batches", "2"],
                              {"BITEXACT_FAULT": "1:1:eval"})
    assert st == [(0, 2), (1, 2)], (st, logs[-3000:])
    mine = sorted(set(lines))
    assert len(mine) == 1 and "bitexact.train: rank 1: " in mine[0] and "eval" in mine[0], logs[-3000:]
    with open(rec) as f:
        assert [l.split(",")[0] for l in f.read().splitlines()] == ['{"step": 0']


@pytest.mark.parametrize("fw", ["torch", "paddle"])
def test_settings_agreed_at_startup(ck0, tmp_path, fw):
    if fw == "paddle":
        pytest.importorskip("paddle")
    ck, _ = ck0
    out = str(tmp_path)
    rec = os.path.join(out, "r.jsonl")
    st, lines, logs = _launch(fw, out, ["--resume", ck, "--steps", "2", "--threads", "1", "-q",
                                        "--record", rec],
                              {"FAULT_ARGS_1": "--grid-history off"})
    assert st == [(0, 2), (1, 2)], (st, logs[-3000:])
    mine = sorted(set(lines))
    assert len(mine) == 1 and "ranks disagree on --grid-history: rank 0 on, rank 1 off" in mine[0], logs[-3000:]
    assert not os.path.exists(rec)
