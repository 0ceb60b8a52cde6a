"""What the torchrun checks (cp_checks_*.py, run by cp_worker.py) share: the single-device
truth of the shifted loss, the CP group of a mesh and a check's batch cut for this rank."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

import cpkit

IGNORE = -100


def shard_for_check(batch: dict, packed: bool, mesh, layout_kind: str = "contiguous",
                    shard_primary: bool = True):
    """A check's batch cut for this rank: packed rows one microbatch each, BSHD rows one
    microbatch; ``mesh`` None: the whole batch on one process."""
    prepare = cpkit.prepare_packed_cp_inputs if packed else cpkit.prepare_cp_inputs
    chunks = batch["labels"].shape[0] if packed else 1
    return prepare(batch, chunks, shard_primary, mesh=mesh, layout=layout_kind)


def single_device_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """HF's causal-LM loss on the whole batch: position t predicts labels[t + 1], mean over
    the counted targets (0 when there are none)."""
    V = logits.shape[-1]
    shift_logits = logits[:, :-1].reshape(-1, V)
    shift_labels = labels[:, 1:].reshape(-1)
    total = F.cross_entropy(shift_logits, shift_labels, ignore_index=IGNORE, reduction="sum")
    count = (shift_labels != IGNORE).sum()
    return total / count if count > 0 else total * 0.0


def truth_labels(batch: dict, packed: bool, m: int) -> torch.Tensor:
    """Microbatch m's labels as an HF collator gives them, written from the spec's rule on
    the raw batch (not from cpkit): -100 on padding (mask 0, slot padding, the row tail)
    and on a packed document's first token, which nothing in its document predicts."""
    if not packed:  # one microbatch of every row
        labels = batch["labels"].clone()
        if batch.get("attention_mask") is not None:
            labels[batch["attention_mask"] == 0] = IGNORE
        return labels
    labels = torch.full_like(batch["labels"][m:m + 1], IGNORE)
    start = 0
    for length, slot in zip(batch["seq_lens"][m].tolist(), batch["seq_lens_padded"][m].tolist()):
        if length < 0:  # the -1000 sentinels end the row's list
            break
        labels[0, start + 1:start + length] = batch["labels"][m, start + 1:start + length]
        start += slot
    return labels


def cp_group(mesh) -> dist.ProcessGroup:
    """The CP group behind ``mesh`` (a 1-D DeviceMesh, a CP sub-mesh or a ProcessGroup)."""
    return mesh.get_group() if hasattr(mesh, "get_group") else mesh


def mean_over_ranks(loss: torch.Tensor, mesh, cp: int) -> torch.Tensor:
    mean = loss.detach().clone()
    dist.all_reduce(mean, group=cp_group(mesh))
    return mean / cp
