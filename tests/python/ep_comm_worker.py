"""Worker of test_ep_comm.py: on a gloo rank, the expert-parallel
communicator (bitexact.nn._ep.ExpertParallel) both ways — through
torch.distributed.all_to_all_single (the torch runner's alltoall) and
through the all-reduce exchange — on uneven byte counts."""
import os

import numpy as np
import torch
import torch.distributed as dist


def main(rank, ws, port, out):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=ws)
    import bitexact.torch as bt
    from bitexact.nn._ep import ExpertParallel
    from bitexact.torch._glm import RUNNER
    res = {}
    for kind in ("alltoall", "allreduce"):
        a2a = RUNNER.alltoall(rank, ws, 2) if kind == "alltoall" else None
        ep = ExpertParallel(bt.comm(), rank, ws, 2, 8, alltoall=a2a)
        peer = rank % 2
        sbytes = [3 + 5 * peer + 2 * p for p in range(2)]  # uneven, not whole words
        send = bytes((17 * rank + i) % 256 for i in range(sum(sbytes)))
        # what each peer p of this group sends here: its bytes for EP rank `peer`
        g0 = rank - peer
        rbytes = [3 + 5 * p + 2 * peer for p in range(2)]
        recv = bytearray(sum(rbytes))
        ep.alltoallv(memoryview(send), tuple(sbytes), memoryview(recv), tuple(rbytes))
        want = b""
        for p in range(2):
            src = g0 + p
            sb = [3 + 5 * p + 2 * q for q in range(2)]
            full = bytes((17 * src + i) % 256 for i in range(sum(sb)))
            want += full[sum(sb[:peer]):sum(sb[:peer + 1])]
        counts = np.array([10 * rank + p for p in range(2)], dtype=np.int64)
        got = bytearray(16)
        ep.alltoall_i64(memoryview(counts.tobytes()), memoryview(got))
        res[kind] = (bytes(recv) == want, np.frombuffer(bytes(got), np.int64).tolist())
    torch.save(res, os.path.join(out, f"rank{rank}.pt"))
    dist.destroy_process_group()
