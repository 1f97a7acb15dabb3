"""Expert parallelism's communicator (bitexact.nn._ep.ExpertParallel, the
all-to-alls the MoE node calls back): torch.distributed.all_to_all_single
over the EP groups and the all-reduce exchange deliver the same bytes, on
uneven counts, in EP groups of 2 over 4 gloo ranks."""
import pytest

torch = pytest.importorskip("torch")

from helpers import needs_gloo, spawn_ranks  # noqa: E402

pytestmark = needs_gloo()


def test_alltoall_and_allreduce_exchange_agree():
    import ep_comm_worker
    ranks = spawn_ranks(ep_comm_worker.main, 4)
    for rank, res in enumerate(ranks):
        g0 = rank - rank % 2
        for kind in ("alltoall", "allreduce"):
            ok, counts = res[kind]
            assert ok, f"rank {rank} {kind}: wrong bytes received"
            assert counts == [10 * (g0 + p) + rank % 2 for p in range(2)], (rank, kind, counts)
