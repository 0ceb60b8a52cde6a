"""torch.library.opcheck on every op: schema, autograd registration, fake tensor and AOT
dispatch, on CPU tensors through a real (one-rank) process group."""

from __future__ import annotations

import pytest
import torch

import cpkit  # noqa: F401  (registers torch.ops.cpkit.*)

IGNORE = -100


def _loss_args(group: str, softcap: float):
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 13, generator=generator, requires_grad=True)
    labels = torch.randint(0, 13, (2, 5), generator=generator)
    labels[0, 2] = IGNORE
    valid = (labels != IGNORE).flatten()
    valid[0] = False
    return (logits, labels, valid, group, softcap)


@pytest.mark.parametrize("softcap", [0.0, 4.0])
def test_shifted_cp_loss(world1, softcap):
    torch.library.opcheck(torch.ops.cpkit.shifted_cp_loss, _loss_args(world1.group_name, softcap))
    torch.library.opcheck(torch.ops.cpkit.shifted_cp_loss, _loss_args("", softcap))


@pytest.mark.parametrize("shape", [(4, 3), (0, 2), (3, 2, 5)])
def test_gather_and_reduce_scatter(world1, shape):
    value = torch.randn(*shape, requires_grad=True)
    for group in (world1.group_name, ""):
        torch.library.opcheck(torch.ops.cpkit.gather_tokens, (value, group))
        torch.library.opcheck(torch.ops.cpkit.reduce_scatter_tokens, (value, group))


def shard_opcheck_args(group: str) -> list[tuple]:
    """BSHD ids with a mask, and packed embeddings: the shard op's arguments for ``group``
    (opcheck at CP > 1 runs under torchrun, python/tests/cp_worker.py)."""
    generator = torch.Generator().manual_seed(2)
    labels = torch.randint(0, 9, (4, 7), generator=generator)
    bshd = (torch.randint(1, 9, (4, 7), generator=generator), None, labels, None,
            torch.ones(4, 7, dtype=torch.long), None, None, "bshd", group, 2, True, 2, 0)
    thd = (None, torch.randn(1, 12, 4, generator=generator), labels[:1, :6].repeat(1, 2), None,
           None, torch.tensor([[4, 0, 5]]), torch.tensor([[5, 1, 5]]), "thd", group, 1, True, 1, 0)
    return [bshd, thd]


def opcheck_shard(group: str) -> None:
    bshd, thd = shard_opcheck_args(group)
    torch.library.opcheck(torch.ops.cpkit.shard, bshd)
    # THD output sizes are data-dependent: no AOT dispatch.
    torch.library.opcheck(torch.ops.cpkit.shard, thd,
                          test_utils=("test_schema", "test_autograd_registration",
                                      "test_faketensor"))


def test_shard(world1):
    opcheck_shard(world1.group_name)
    opcheck_shard("")


def test_cut_spliced():
    spliced = torch.randn(2, 7, 3, requires_grad=True)
    torch.library.opcheck(torch.ops.cpkit.cut_spliced, (spliced, 3, 2, 1, 0.0))
    torch.library.opcheck(torch.ops.cpkit.cut_spliced_backward, (torch.randn(2, 3, 3), 7, 3, 2, 1))
