"""`bitexact demo`: identical bitexact bits in every layout."""
import json
import math
import os
import shutil
import struct
import subprocess

import stfiles
from harness import *  # noqa: F401,F403 - the shared helpers and data
from harness import np, np_save, torch, torch_save, xxhash  # noqa: F401


# ------------------------------------------------------------- demo


def check_demo(d, min_layouts=16):
    lays = d["layouts"]
    assert len(lays) >= min_layouts, len(lays)
    bits = {l["bitexact_bits"] for l in lays}
    coefs = {l["clip_coef_bits"] for l in lays}
    assert len(bits) == 1 and len(coefs) == 1, (bits, coefs)
    assert all(l["ranks_agree"] for l in lays)
    assert {l["ranks"] for l in lays} == {1, 2, 4, 8} and {l["threads"] for l in lays} == {1, 2}
    assert {l["order"] for l in lays} == {"model", "shuffled"}
    assert len({l["naive_fp32_bits"] for l in lays}) > 1, "naive fp32 norms should differ"
    assert d["identical"] and d["bitexact_distinct"] == 1
    assert 0 < lays[0]["clip_coef"] < 1


@test
def demo_table_identical_bits():
    rc, out, err = run("demo", check=0)
    rows = [l for l in out.splitlines() if l[:1].isdigit()]
    assert len(rows) == 16, out
    exact_bits = {r.split("|")[2].split()[1] for r in rows}
    naive_bits = {r.split("|")[1].split()[1] for r in rows}
    assert len(exact_bits) == 1 and len(naive_bits) > 1, (exact_bits, naive_bits)
    assert "identical bits in every layout" in out
    check_demo(run_json("demo"))


@test
def demo_under_mpi():
    if not Ctx.mpi:
        raise Skip("built without MPI")
    mpirun = shutil.which("mpirun")
    if not mpirun:
        raise Skip("no mpirun")
    args = [mpirun, "--oversubscribe", "-np", "4"]
    if os.geteuid() == 0:
        args.insert(1, "--allow-run-as-root")
    # Open MPI itself leaks at exit: keep LeakSanitizer (SAN=1 builds) quiet here
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=0:" + os.environ.get("ASAN_OPTIONS", ""))
    p = subprocess.run(args + [Ctx.bin, "demo", "--json"], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=300, env=env)
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    d = json.loads(p.stdout)
    check_demo(d)
    assert d["mpi_world_size"] == 4
    vias = {(l["ranks"], l["via"]) for l in d["layouts"]}
    assert (4, "mpi") in vias and (2, "mpi") in vias and (8, "threads") in vias, vias
