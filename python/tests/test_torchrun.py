"""cpkit under torchrun (gloo on CPU), CP 2, 3 and 4, and a CP sub-mesh of a (dp 2, cp 2)
mesh: sharding (strided inputs too), varlen offsets, gather forward/backward, and every
rank's loss and logits gradient against plain PyTorch on the unsharded batch (BSHD and
packed documents straddling ranks, soft cap, N == 0); ranks that disagree (gather dtype,
loss length and vocabulary, a different batch per rank) raise on every rank within a second;
a peer that dies in the loss's exchange makes the others raise; torch.compile(fullgraph=True)
at CP 2, 3, 4 with upstreams 1 and 0.5, 3-microbatch accumulation and keys gathered along
the sequence dim. The checks live in cp_checks_*.py, run by cp_worker.py."""

from __future__ import annotations

import os
import subprocess

import pytest

from conftest import HERE


def run_world(torchrun, cp: int, **env: str) -> str:
    result = subprocess.run(
        [*torchrun, "--standalone", f"--nproc_per_node={cp}", str(HERE / "cp_worker.py")],
        env={**os.environ, "OMP_NUM_THREADS": "1", **env},
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-8000:]
    return result.stdout


@pytest.mark.parametrize("cp", [2, 3, 4])
def test_cp_world_matches_single_device(torchrun, cp):
    out = run_world(torchrun, cp)
    assert out.count("all checks passed") == cp, out


def test_process_group_as_mesh(torchrun):
    out = run_world(torchrun, 2, CPKIT_MESHES="process_group")
    assert out.count("all checks passed") == 2, out


def test_cp_sub_mesh_of_a_dp_cp_mesh(torchrun):
    """World 4 on a (dp 2, cp 2) DeviceMesh passing mesh["cp"]: sharding, offsets, gather and
    both losses use CP-group ranks, not global ranks."""
    out = run_world(torchrun, 4, CPKIT_MESHES="dp_cp")
    for replica in (0, 1):
        for rank in (0, 1):
            assert f"rank {rank}/2 (replica {replica}): all checks passed" in out, out


@pytest.mark.parametrize("cp", [2, 3, 4])
def test_compiled_step_matches_eager(torchrun, cp):
    out = run_world(torchrun, cp, CPKIT_COMPILE="1")
    assert out.count("all checks passed") == cp, out


def test_dead_peer_in_the_loss_raises_on_the_others(torchrun):
    out = run_world(torchrun, 3, CPKIT_DEAD_PEER_TIMEOUT_S="3")
    assert out.count("dead peer raised") == 2, out
