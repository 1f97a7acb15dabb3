"""`bitexact train`: a failure on some ranks reaches every rank (docs/faults.md).

Agreement inside the step (issue 29 item 1): BITEXACT_FAULT=RANK:STEP:POINT
makes one non-zero rank fail at one point of one step (alloc, data, kernel,
loss, save) under `mpirun -np 2` and `-np 4`, with and without --ep: every
rank exits 2 by itself within seconds (the subprocess timeout would fire on a
hang), one line names the rank and the cause, the record has no line of the
failed step, and the checkpoint of the previous --save-every is intact and
continues bit for bit under --resume. Start-up agreement (item 2): ranks
launched with different settings (Open MPI's MPMD syntax) stop with one line
naming the setting and each rank's value; a start-up failure on one rank
names that rank.
"""
import os
import shutil
import subprocess

from harness import *  # noqa: F401,F403 - the shared helpers and data
from harness import np  # noqa: F401
from cases_train import FAST, records, tpath

CAUSE = {"alloc": "out of memory", "data": "outside [0, 1024)", "kernel": "the routed experts",
         "loss": "non-finite loss", "save": "--save"}
STEPS, AT = 4, 2  # the run's steps; the failing step


def mpirun_cmd():
    if not Ctx.mpi:
        raise Skip("built without MPI")
    mpirun = shutil.which("mpirun")
    if not mpirun:
        raise Skip("no mpirun")
    return [mpirun, "--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])


def env_for(**kw):
    return dict(os.environ, ASAN_OPTIONS="detect_leaks=0:" + os.environ.get("ASAN_OPTIONS", ""), **kw)


def run_ranks(np_, args, status, env):
    """mpirun -np np_ bitexact train args, each rank's exit status appended to
    the file status ("RANK STATUS"; the wrapper exits 0, so mpirun never kills
    a rank that is still on its way out)."""
    wrap = ('"$0" "$@"; echo "$OMPI_COMM_WORLD_RANK $?" >> ' + status + "; exit 0")
    cmd = mpirun_cmd() + ["-np", str(np_), "sh", "-c", wrap, Ctx.bin, "train", *map(str, args)]
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60, env=env)


def reference():
    """One process, STEPS steps: the records every layout equals."""
    ref = tpath("faults_ref.jsonl")
    if not os.path.exists(ref):
        run("train", *FAST, "--steps", STEPS, "--record", ref, "-q")
    return records(ref)


def one_fault(np_, ep, point, rank):
    ref = reference()
    tag = f"faults_{np_}_{ep}_{point}"
    rec, ck, status = tpath(tag + ".jsonl"), tpath(tag + "_ck"), tpath(tag + ".status")
    for f in (rec, status):
        if os.path.exists(f):
            os.remove(f)
    shutil.rmtree(ck, ignore_errors=True)
    p = run_ranks(np_, [*FAST, "--steps", STEPS, "--ep", ep, "--record", rec, "--save", ck,
                        "--save-every", 1, "-q"], status,
                  env_for(BITEXACT_FAULT=f"{rank}:{AT}:{point}"))
    err = p.stderr.decode()
    with open(status) as fh:
        st = sorted(tuple(map(int, l.split())) for l in fh if l.strip())
    assert st == [(r, 2) for r in range(np_)], (np_, ep, point, st, err[-3000:])
    mine = [l for l in err.splitlines() if l.startswith("bitexact: ")]
    assert len(mine) == 1 and mine[0].startswith(f"bitexact: train: rank {rank}: ") and \
        CAUSE[point] in mine[0], (np_, ep, point, err[-3000:])
    # the failed step left no record line and no checkpoint (a failed save: the step's line
    # stands, the records never lag the checkpoint)
    lines = AT + 1 if point == "save" else AT
    assert records(rec) == ref[:lines], (point, records(rec))
    with open(os.path.join(ck, "trainer_state.json")) as fh:
        assert '"step": %d' % AT in fh.read()
    assert not [f for f in os.listdir(os.path.dirname(ck)) if f.startswith(os.path.basename(ck) + ".tmp")]
    # the checkpoint is whole: it continues bit for bit
    more = tpath(tag + "_more.jsonl")
    run("train", *FAST, "--steps", AT + 1, "--resume", ck, "--record", more, "-q")
    assert records(more) == ref[AT:AT + 1], (point, records(more))


def faults(np_, ep):
    for point in ("alloc", "data", "kernel", "loss", "save"):
        one_fault(np_, ep, point, np_ - 1)


@test
def train_fault_np2():
    faults(2, 1)


@test
def train_fault_np2_ep2():
    faults(2, 2)


@test
def train_fault_np4():
    faults(4, 1)


@test
def train_fault_np4_ep4():
    faults(4, 4)


@test
def train_fault_np4_ep2_rank1():
    """The failing rank's EP peers learn it from its status word, the other EP
    group at the step's agreement."""
    for point in ("kernel", "alloc"):
        one_fault(4, 2, point, 1)


@test
def train_fault_one_process():
    ref = reference()
    rec, ck = tpath("faults_1.jsonl"), tpath("faults_1_ck")
    shutil.rmtree(ck, ignore_errors=True)
    rc, out, err = run("train", *FAST, "--steps", STEPS, "--record", rec, "--save", ck, "--save-every", 1,
                       "-q", check=2, env=env_for(BITEXACT_FAULT=f"0:{AT}:kernel"))
    assert "bitexact: train: step 2: the routed experts" in err and "rank" not in err, err
    assert records(rec) == ref[:AT]
    # a malformed switch is refused by name
    rc, out, err = run("train", *FAST, "--steps", 1, check=2, env=env_for(BITEXACT_FAULT="1:2:disk"))
    assert "BITEXACT_FAULT '1:2:disk'" in err, err


@test
def train_fault_in_eval_under_ep():
    """A rank whose eval forward fails between two row exchanges (point
    "eval": the routed experts of the eval's forward) drains its EP peers:
    every rank exits 2, one line names it, the record ends before the step."""
    from cases_train import npy_bytes, write
    ev = write("faults_eval.npy", npy_bytes((np.arange(4 * 17 * 2, dtype="<i4") * 7) % 1024))
    for np_, ep in ((2, 2), (4, 2)):
        tag = f"faults_eval_{np_}_{ep}"
        rec, status = tpath(tag + ".jsonl"), tpath(tag + ".status")
        for f in (rec, status):
            if os.path.exists(f):
                os.remove(f)
        p = run_ranks(np_, [*FAST, "--steps", STEPS, "--ep", ep, "--record", rec, "--eval-data", ev,
                            "--eval-every", 1, "--micro-batches", 1, "-q"], status,
                      env_for(BITEXACT_FAULT=f"{np_ - 1}:{AT}:eval"))
        err = p.stderr.decode()
        with open(status) as fh:
            st = sorted(tuple(map(int, l.split())) for l in fh if l.strip())
        assert st == [(r, 2) for r in range(np_)], (np_, ep, st, err[-3000:])
        mine = [l for l in err.splitlines() if l.startswith("bitexact: ")]
        assert len(mine) == 1 and mine[0].startswith(f"bitexact: train: rank {np_ - 1}: ") and \
            "the routed experts" in mine[0], err[-3000:]
        rows = records(rec)
        assert [r["step"] for r in rows] == list(range(AT)) and all("eval_loss" in r for r in rows)


def mpmd(groups, env=None):
    """Open MPI's MPMD launch: groups = [(np, [args...]), ...]."""
    cmd = mpirun_cmd()
    for i, (n, args) in enumerate(groups):
        cmd += ([":"] if i else []) + ["-np", str(n), Ctx.bin, "train", *FAST, "--steps", "1",
                                       *map(str, args)]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60,
                       env=env or env_for())
    return p, [l for l in p.stderr.decode().splitlines() if l.startswith("bitexact: ")]


@test
def train_startup_settings_agreed():
    rec = tpath("faults_mpmd.jsonl")
    cases = [
        ([(1, ["--compute-dtype", "fp32"]), (1, ["--compute-dtype", "bf16"])],
         "ranks disagree on --compute-dtype: rank 0 fp32, rank 1 bf16"),
        ([(1, ["--seed", "1"]), (3, ["--seed", "2", "--lr", "0.1"])],
         "ranks disagree on --seed: rank 0 1, rank 1 2, rank 2 2, rank 3 2 (also: --lr)"),
        ([(1, ["--mode", "ordinary"]), (1, [])], "ranks disagree on --mode: rank 0 ordinary, rank 1 invariant"),
        ([(1, []), (1, ["--micro-batches", "2"])], "ranks disagree on --micro-batches: rank 0 1, rank 1 2"),
        ([(1, ["--save", tpath("faults_mpmd_ck")]), (1, [])], "ranks disagree on --save: rank 0 given, rank 1 not given"),
        ([(1, []), (1, ["--grid-history", "off"])], "ranks disagree on --grid-history: rank 0 on, rank 1 off"),
    ]
    # the same token count, other bytes: the files' fingerprints differ
    a, b = tpath("faults_a.npy"), tpath("faults_b.npy")
    np.save(a, (np.arange(4096) % 1000).astype("<u2"))
    np.save(b, (np.arange(4096) % 999).astype("<u2"))
    cases.append(([(1, ["--data", a]), (1, ["--data", b])],
                  "ranks disagree on --data (the file's size, first and last MiB): rank 0 xxh3:"))
    for groups, needle in cases:
        groups = [(n, list(g) + ["--record", rec]) for n, g in groups]
        if os.path.exists(rec):
            os.remove(rec)
        p, mine = mpmd(groups)
        assert p.returncode != 0 and len(mine) == 1 and needle in mine[0], (needle, mine, p.stderr.decode()[-2000:])
        assert not os.path.exists(rec), needle
    # a start-up failure on one rank alone: that rank is named, nothing written
    p, mine = mpmd([(1, ["--record", rec]), (1, ["--record", rec, "--data", tpath("faults_none.npy")])])
    assert p.returncode != 0 and len(mine) == 1 and mine[0].startswith("bitexact: train: rank 1: ") and \
        "faults_none.npy" in mine[0], mine
    assert not os.path.exists(rec)
    # every rank alike: one plain line, as before
    p, mine = mpmd([(2, ["--record", rec, "--data", tpath("faults_none.npy")])])
    assert p.returncode != 0 and len(mine) == 1 and mine[0].startswith("bitexact: train: ") and \
        "rank" not in mine[0], mine
