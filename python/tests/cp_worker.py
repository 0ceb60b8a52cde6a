"""One rank of a CP world started by torchrun (gloo on CPU), checking cpkit against plain
PyTorch on the unsharded batch. Run by test_torchrun.py:
    torchrun --standalone --nproc_per_node=N cp_worker.py
Every check raises on a difference; the exit code tells the test. The checks live in
cp_checks_losses.py, cp_checks_tokens.py and cp_checks_errors.py."""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

import torchrun_exit
from cp_checks_errors import check_compile, check_dead_peer_in_loss, check_errors
from cp_checks_losses import check_linear_loss, check_loss, check_token_logprobs
from cp_checks_tokens import (check_cp_attention, check_gather, check_layout_streams,
                              check_offsets, check_sharding)
from cp_support import IGNORE, cp_group


def main() -> None:
    dead_peer_timeout = float(os.environ.get("CPKIT_DEAD_PEER_TIMEOUT_S", "0"))
    if dead_peer_timeout > 0:
        dist.init_process_group("gloo", timeout=timedelta(seconds=dead_peer_timeout))
        check_dead_peer_in_loss(dist.get_rank(), dist.get_world_size(), dead_peer_timeout)
    dist.init_process_group("gloo")
    world, replica = dist.get_world_size(), 0
    names = os.environ.get("CPKIT_MESHES", "device_mesh")
    if names == "dp_cp":
        # A CP sub-mesh of a (dp 2, cp world/2) mesh: CP ranks are not global ranks, and each
        # data-parallel replica trains on its own batch.
        mesh_2d = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "cp"))
        mesh, replica = mesh_2d["cp"], mesh_2d["dp"].get_local_rank()
    elif names == "device_mesh":
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("cp",))
    else:
        mesh = dist.group.WORLD
    rank, cp = dist.get_rank(cp_group(mesh)), dist.get_world_size(cp_group(mesh))
    check_gather(mesh, rank, cp)
    check_sharding(mesh, rank, cp)
    for kind in ("contiguous", "head_tail", "balanced"):
        check_offsets(mesh, rank, cp, kind)
    vocab = 37
    generator = torch.Generator().manual_seed(3 + 100 * replica)
    bshd = {"input_ids": torch.randint(1, vocab, (2, 19), generator=generator),
            "labels": torch.randint(0, vocab, (2, 19), generator=generator),
            "attention_mask": torch.ones(2, 19, dtype=torch.long)}
    bshd["attention_mask"][1, :3] = 0  # left padding
    bshd["labels"][0, 5] = IGNORE
    check_loss(bshd, False, mesh, rank, cp, vocab, seed=11)
    check_loss(bshd, False, mesh, rank, cp, vocab, seed=12, softcap=2.5)
    packed = {"input_ids": torch.randint(1, vocab, (2, 29), generator=generator),
              "labels": torch.randint(0, vocab, (2, 29), generator=generator),
              "seq_lens": torch.tensor([[13, 0, 9, 2], [27, -1000, -1000, -1000]]),
              "seq_lens_padded": torch.tensor([[14, 1, 9, 3], [29, -1000, -1000, -1000]]),
              "qkv_format": "thd"}
    check_loss(packed, True, mesh, rank, cp, vocab, seed=13)
    # N == 0: every label ignored; the loss and its gradient are exactly 0, never NaN.
    check_loss({**bshd, "labels": torch.full((2, 19), IGNORE)}, False, mesh, rank, cp, vocab, seed=14)
    check_linear_loss(bshd, False, mesh, rank, cp, vocab, seed=15, chunk_rows=3)
    check_linear_loss(packed, True, mesh, rank, cp, vocab, seed=16, softcap=4.0)
    # Load-balanced layouts (spec 2b): the same truths.
    check_layout_streams(bshd, False, mesh, rank, cp, "head_tail")
    check_loss(bshd, False, mesh, rank, cp, vocab, seed=17, layout_kind="head_tail")
    check_linear_loss(bshd, False, mesh, rank, cp, vocab, seed=18, layout_kind="head_tail")
    for kind in ("head_tail", "balanced"):
        check_layout_streams(packed, True, mesh, rank, cp, kind)
        check_loss(packed, True, mesh, rank, cp, vocab, seed=19, softcap=2.5, layout_kind=kind)
        check_linear_loss(packed, True, mesh, rank, cp, vocab, seed=20, chunk_rows=5,
                          layout_kind=kind)
    check_token_logprobs(bshd, False, mesh, rank, cp, vocab, seed=21)
    check_token_logprobs(packed, True, mesh, rank, cp, vocab, seed=22, softcap=4.0,
                         temperature=0.7, layout_kind="balanced")
    for kind in ("contiguous", "head_tail", "balanced"):
        check_cp_attention(packed, mesh, rank, cp, kind, window=0 if kind != "head_tail" else 4)
    check_errors(mesh, rank, cp)
    if os.environ.get("CPKIT_COMPILE") == "1":
        check_compile(mesh, rank, cp)
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank}/{cp} (replica {replica}): all checks passed", flush=True)


if __name__ == "__main__":
    torchrun_exit.run(main)
