"""`bitexact train --device cuda` (issue 30, docs/cuda.md): the model's
buffers in CUDA managed memory, its calls on the device where they have a
CUDA kernel. CI has no GPU, so these cases run the device path on the host
simulation of the device backend (BITEXACT_TEST_DEVICE=sim, src/hostsim:
the CUDA launchers' grids over the same thread bodies, and every pointer a
launcher dereferences checked to lie in memory the device handed out):
records, checkpoints and traces equal the CPU run's byte for byte, on one
rank, with micro-batches, bf16 operands, an eval pass, and two ranks with expert
parallelism; a planted one-ULP error in the simulated GEMM makes them
differ (so the device path did run); bad --device values and a machine
without a GPU are refused with one line, nothing written."""
import json
import os
import shutil
import subprocess

from harness import *  # noqa: F401,F403 - the shared helpers and data
from cases_train import FAST, eval_file, expect_train_error, tpath


def sim_env(kind="sim"):
    return dict(os.environ, BITEXACT_TEST_DEVICE=kind,
                ASAN_OPTIONS="detect_leaks=0:" + os.environ.get("ASAN_OPTIONS", ""))


def run_train(tag, device, *args, kind="sim", np_=1):
    """One run writing record, checkpoint and trace under tag; returns their paths."""
    rec, ck, tr = tpath(f"dev_{tag}.jsonl"), tpath(f"dev_{tag}_ck"), tpath(f"dev_{tag}.trace")
    for f in (rec, tr):
        if os.path.exists(f):
            os.remove(f)
    shutil.rmtree(ck, ignore_errors=True)
    full = ["train", *FAST, "--steps", "2", "--record", rec, "--save", ck, "--trace", tr,
            "--device", device, "-q", *args]
    env = sim_env(kind) if device != "cpu" else None
    if np_ == 1:
        rc, out, err = run(*full, env=env)
        assert rc == 0, (tag, rc, err[-2000:])
    else:
        if not Ctx.mpi:
            raise Skip("built without MPI")
        mpirun = shutil.which("mpirun")
        if not mpirun:
            raise Skip("no mpirun")
        cmd = [mpirun, "--oversubscribe", "-np", str(np_), "-x", "BITEXACT_TEST_DEVICE"]
        if os.geteuid() == 0:
            cmd.insert(1, "--allow-run-as-root")
        p = subprocess.run(cmd + [Ctx.bin, *full], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=600, env=env or sim_env("none"))
        assert p.returncode == 0, (tag, p.stderr.decode()[-2000:])
    return rec, ck, tr


def same_files(a, b):
    for x, y in ((a[0], b[0]), (a[2], b[2]),
                 (os.path.join(a[1], "model.safetensors"), os.path.join(b[1], "model.safetensors")),
                 (os.path.join(a[1], "optimizer", "optimizer.safetensors"),
                  os.path.join(b[1], "optimizer", "optimizer.safetensors"))):
        with open(x, "rb") as f, open(y, "rb") as g:
            if f.read() != g.read():
                return x, y
    return None


@test
def train_device_sim_equals_cpu():
    ev = eval_file("dev_eval.npy", 4000, 3)  # --eval-data: the eval loss's partials on the device
    for tag, args in (("one", ()), ("mb2", ("--micro-batches", "2")),
                      ("bf16", ("--compute-dtype", "bf16")),
                      ("eval", ("--eval-data", ev, "--eval-every", "1", "--eval-batches", "2"))):
        cpu = run_train(tag + "_cpu", "cpu", *args)
        dev = run_train(tag + "_dev", "cuda", *args)
        assert same_files(cpu, dev) is None, (tag, same_files(cpu, dev))


@test
def train_device_calls_reach_the_device():
    """The summary names the calls that ran on the device: every training
    call of the step that has a CUDA kernel (the GEMMs, attention, norms,
    the MoE routing and dispatch, the loss, the token reductions and the
    weight gradients, AdamW); none on the CPU."""
    rc, out, err = run("train", *FAST, "--steps", "1", "--device", "cuda", "--json", env=sim_env())
    assert rc == 0, err
    calls = json.loads(out)["device_calls"]
    want = {"bx_gemm", "bx_linear_wgrad", "bx_tokred_add", "bx_attention_forward",
            "bx_attention_backward", "bx_rmsnorm_forward", "bx_rmsnorm_backward",
            "bx_rope_forward", "bx_rope_backward", "bx_swiglu_forward", "bx_swiglu_backward",
            "bx_moe_router_forward", "bx_moe_router_backward", "bx_moe_permute",
            "bx_moe_permute_backward", "bx_moe_unpermute", "bx_moe_unpermute_backward",
            "bx_embedding_forward", "bx_embedding_backward", "bx_xent_forward_backward",
            "bx_adamw_step"}
    assert want <= set(calls), sorted(want - set(calls))
    assert all(v > 0 for v in calls.values()), calls
    rc, out, err = run("train", *FAST, "--steps", "1", "--json")
    assert rc == 0 and json.loads(out)["device_calls"] == {}, (out, err)
    assert json.loads(out)["device"] == "cpu"


@test
def train_device_sim_ranks_and_experts():
    cpu = run_train("ep_cpu", "cpu")
    dev = run_train("ep_dev", "cuda:0", "--ep", "2", np_=2)
    assert same_files(cpu, dev) is None, same_files(cpu, dev)


@test
def train_device_sim_plant_differs():
    """The negative control: the simulated GEMM moves one output by one ULP;
    the records must differ from the CPU run's, and `bitexact diff --trace`
    names a forward entry of step 0 first."""
    cpu = run_train("pl_cpu", "cpu")
    dev = run_train("pl_dev", "cuda", kind="sim-plant")
    with open(cpu[0], "rb") as f, open(dev[0], "rb") as g:
        assert f.read() != g.read(), "the planted device error did not show"
    rc, out, err = run("diff", "--trace", "--json", cpu[2], dev[2])
    assert rc == 1, (rc, out[-1500:], err)
    first = json.loads(out)["first"]
    assert (first["step"], first["phase"]) == (0, "forward"), first


@test
def train_device_errors():
    expect_train_error(*FAST, "--device", "gpu", needles=("--device", "'gpu'"))
    expect_train_error(*FAST, "--device", "cuda:x", needles=("--device",))
    probe = subprocess.run([Ctx.bin, "train", *FAST, "--steps", "0", "--device", "cuda"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120,
                           env=dict(os.environ, BITEXACT_TEST_DEVICE=""))
    if probe.returncode == 0:
        raise Skip("a usable CUDA device is present: the no-device error cannot be shown")
    expect_train_error(*FAST, "--device", "cuda", needles=("--device cuda:0",))
