"""Restarts of `bitexact train` (issue 29 items 3 and 4; docs/restart.md):
a checkpoint saved on one layout resumes on another with the straight
run's records and checkpoint files, byte for byte; a run killed (SIGKILL)
at any point of the checkpoint writer leaves DIR holding a complete
checkpoint that resumes bit for bit; stale temporary directories are
removed unless a live writer holds them; a handful of random crash trials
(scripts/crash_trials.py) on 1 process and on one rank of mpirun -np 4."""
import fcntl
import glob
import json
import os
import subprocess
import sys

from harness import Ctx, Skip, run, test
from cases_train import FAST, mpirun_train, tpath

STEPS, K = 4, 2
POINTS = ("tmpdir", "config", "torn", "model", "optimizer", "state", "synced", "renamed", "done")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def read(p):
    with open(p, "rb") as f:
        return f.read()


def files(d):
    out = {}
    for root, _, names in os.walk(d):
        for n in names:
            out[os.path.relpath(os.path.join(root, n), d)] = read(os.path.join(root, n))
    return out


def lines(p):
    return read(p).splitlines(keepends=True)


def ckpt_hash(d):
    """bitexact hash's checkpoint hash of the model (one file or shards)."""
    fs = sorted(glob.glob(os.path.join(d, "*.safetensors")))
    rc, out, err = run("hash", "--json", *fs, check=0)
    return json.loads(out)["checkpoint"]


def train_ok(np_, *args):
    """bitexact train on np_ ranks (mpirun when np_ > 1); exit 0 asserted."""
    if np_ == 1:
        rc, out, err = run("train", *FAST, "-q", *map(str, args), check=None)
        assert rc == 0, err
        return
    p = mpirun_train(np_, *FAST, "-q", *args)
    assert p.returncode == 0, p.stderr.decode()[-2000:]


def straight(tag, *extra):
    """The straight np 4 --ep 4 run of STEPS steps (record, checkpoint) and
    its checkpoint after K steps."""
    rec, ck, ckk = tpath(tag + "_straight.jsonl"), tpath(tag + "_straight"), tpath(tag + "_k")
    train_ok(4, "--ep", 4, "--steps", STEPS, "--record", rec, "--save", ck, *extra)
    train_ok(4, "--ep", 4, "--steps", K, "--save", ckk, *extra)
    return rec, ck, ckk


@test
def restart_elastic_layouts():
    """Saved at step K on mpirun -np 4 --ep 4, resumed on -np 2 --ep 2, on
    -np 2 --ep 1 with 2 micro-batches and on 1 process with 2 threads: the
    records are the straight run's steps K.. and every file of the final
    checkpoint is the straight run's (1 process too: the same bytes)."""
    if not Ctx.mpi:
        raise Skip("built without MPI")
    rec, ck, ckk = straight("el")
    one_rec, one_ck = tpath("el_one.jsonl"), tpath("el_one")
    train_ok(1, "--steps", STEPS, "--record", one_rec, "--save", one_ck)
    assert read(one_rec) == read(rec) and files(one_ck) == files(ck)
    for np_, extra in ((2, ("--ep", 2)), (2, ("--micro-batches", 2)), (1, ("--threads", 2))):
        r, c = tpath("el_r%d.jsonl" % np_), tpath("el_c%d_%s" % (np_, extra[0]))
        train_ok(np_, "--resume", ckk, "--steps", STEPS, "--record", r, "--save", c, *extra)
        assert lines(r) == lines(rec)[K:], (np_, extra)
        assert files(c) == files(ck), (np_, extra)


@test
def restart_elastic_sharded():
    """A sharded checkpoint (--save-max-shard-size) of -np 4 --ep 4 resumes
    on -np 2 --ep 2 saving shards (the straight sharded run's files) and
    on 1 process saving one file (the straight run's files)."""
    if not Ctx.mpi:
        raise Skip("built without MPI")
    sh = ("--save-max-shard-size", "1MB")
    rec, ck, ckk = straight("sh", *sh)
    assert os.path.exists(os.path.join(ckk, "model.safetensors.index.json"))
    assert len(glob.glob(os.path.join(ckk, "model-*-of-*.safetensors"))) > 1
    r, c = tpath("sh_r2.jsonl"), tpath("sh_c2")
    train_ok(2, "--ep", 2, "--resume", ckk, "--steps", STEPS, "--record", r, "--save", c, *sh)
    assert lines(r) == lines(rec)[K:]
    assert files(c) == files(ck)
    r1, c1 = tpath("sh_r1.jsonl"), tpath("sh_c1")
    train_ok(1, "--resume", ckk, "--steps", STEPS, "--record", r1, "--save", c1)
    assert lines(r1) == lines(rec)[K:]
    assert os.listdir(c1) and not glob.glob(os.path.join(c1, "model-*"))
    assert ckpt_hash(c1) == ckpt_hash(ck)
    assert read(os.path.join(c1, "optimizer/optimizer.safetensors")) == \
        read(os.path.join(ck, "optimizer/optimizer.safetensors"))


def killed_run(d, rec, point, nth, *extra):
    env = dict(os.environ, BITEXACT_TEST_CKPT_KILL="%s:%d" % (point, nth))
    rc, out, err = run("train", *FAST, "-q", "--steps", STEPS, "--save", d, "--save-every", 1,
                       "--record", rec, *extra, env=env, check=None)
    assert rc != 0, (point, "the hook did not fire")
    return rc


@test
def restart_crash_every_writer_point():
    """SIGKILL at every named point of the writer (BITEXACT_TEST_CKPT_KILL,
    the 2nd save: step 2), one file and shards: DIR holds step 1 until the
    rename, step 2 from it on, never a torn file; the "torn" point leaves a
    short file in DIR.tmp-*; --resume DIR --save DIR continues bit for bit
    and removes the stale DIR.tmp-*."""
    ref_rec, ref_ck = tpath("cp_ref.jsonl"), tpath("cp_ref")
    train_ok(1, "--steps", STEPS, "--record", ref_rec, "--save", ref_ck)
    ref_sh = tpath("cp_ref_sh")
    train_ok(1, "--steps", STEPS, "--save", ref_sh, "--save-max-shard-size", "1MB")
    for extra, ref in (((), ref_ck), (("--save-max-shard-size", "1MB"), ref_sh)):
        for point in POINTS:
            d, rec = tpath("cp_D"), tpath("cp_rec.jsonl")
            for x in glob.glob(d + "*"):
                subprocess.run(["rm", "-rf", x], check=True)
            nth = 2
            if point == "torn":  # the 2nd save's first file: the model (or its first shard)
                nth = 3 if not extra else len(glob.glob(os.path.join(ref_sh, "*.safetensors"))) + 2
            killed_run(d, rec, point, nth, *extra)
            with open(os.path.join(d, "trainer_state.json")) as f:
                k = json.load(f)["step"]
            want = 2 if point in ("renamed", "done") else 1
            assert k == want, (point, extra, k)
            tmp = glob.glob(d + ".tmp-*")
            assert (point == "done") == (not tmp), (point, tmp)
            if point == "torn":
                got = [f for f in glob.glob(os.path.join(tmp[0], "*.safetensors"))]
                assert got and all(os.path.getsize(f) < os.path.getsize(os.path.join(ref, os.path.basename(f)))
                                   for f in got), (got,)
            r2 = tpath("cp_rec2.jsonl")
            train_ok(1, "--resume", d, "--steps", STEPS, "--record", r2, "--save", d,
                     "--save-every", 1, *extra)
            assert lines(r2) == lines(ref_rec)[k:], (point, extra)
            assert files(d) == files(ref), (point, extra)
            assert not glob.glob(d + ".tmp-*"), (point, glob.glob(d + ".tmp-*"))


@test
def restart_stale_tmp_locked_kept():
    """A DIR.tmp-* that a live writer holds (flock) is not removed by a
    save; one that holds other files keeps them; an unheld one of
    checkpoint files is removed."""
    d = tpath("st_D")
    train_ok(1, "--steps", 1, "--save", d)
    held, other, stale = d + ".tmp-HELD01", d + ".tmp-OTHER1", d + ".tmp-STALE1"
    for t in (held, other, stale):
        os.makedirs(t, exist_ok=True)
        with open(os.path.join(t, "config.json"), "w") as f:
            f.write("{}")
    with open(os.path.join(other, "notes.txt"), "w") as f:
        f.write("mine")
    fd = os.open(held, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        train_ok(1, "--steps", 2, "--resume", d, "--save", d)
        assert os.path.exists(os.path.join(held, "config.json"))
        assert os.path.exists(os.path.join(other, "notes.txt"))
        assert not os.path.exists(other + "/config.json") and not os.path.exists(stale)
    finally:
        os.close(fd)
    train_ok(1, "--steps", 3, "--resume", d, "--save", d)
    assert not os.path.exists(held) and os.path.exists(os.path.join(other, "notes.txt"))


@test
def restart_crash_trials_small():
    """scripts/crash_trials.py, a handful of trials: 1 process (seed 7) and
    one rank of mpirun -np 4 (seed 3), every outcome resumed bit for bit or
    the previous checkpoint kept."""
    script = os.path.join(ROOT, "scripts", "crash_trials.py")
    runs = [("--trials", "8", "--seed", "7")]
    if Ctx.mpi:
        runs.append(("--np", "4", "--trials", "4", "--seed", "3", "--timeout", "60"))
    for args in runs:
        p = subprocess.run([sys.executable, script, "--bin", Ctx.bin, *args],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
        out = p.stdout.decode()
        assert p.returncode == 0 and "FAILURE" not in out, out[-3000:]
        last = [ln for ln in out.splitlines() if ln.startswith("trials ")]
        assert last and "trials %s" % args[args.index("--trials") + 1] in last[0], out[-2000:]
    if not Ctx.mpi:
        raise Skip("built without MPI: the mpirun trials did not run (1-process trials passed)")
