"""torch.library.opcheck on every op: schema, autograd registration, fake tensor and AOT
dispatch, on CPU tensors through a real (one-rank) process group."""

from __future__ import annotations

import pytest
import torch

import cpkit  # registers torch.ops.cpkit.*

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
        for dim in (0, len(shape) - 1, -1):
            torch.library.opcheck(torch.ops.cpkit.gather_tokens, (value, group, dim))
            torch.library.opcheck(torch.ops.cpkit.reduce_scatter_tokens, (value, group, dim))


def shard_opcheck_args(group: str) -> list[tuple]:
    """BSHD ids with a mask, and packed embeddings: the shard op's arguments for ``group``
    (opcheck at CP > 1 runs under torchrun, python/tests/cp_worker.py)."""
    generator = torch.Generator().manual_seed(2)
    labels = torch.randint(0, 9, (4, 7), generator=generator)
    bshd = (torch.randint(1, 9, (4, 7), generator=generator), None, labels, None,
            torch.ones(4, 7, dtype=torch.long), None, None, [torch.zeros(3, 2, 2)], "bshd", False,
            group, 2, True, 2, 0, "head_tail")
    thd = (None, torch.randn(1, 12, 4, generator=generator), labels[:1, :6].repeat(1, 2), None,
           None, torch.tensor([[4, 0, 5]]), torch.tensor([[5, 1, 5]]), [], "thd", True, group, 1,
           True, 1, 0, "balanced")
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


# Layout plans written out (python/csrc/layout_codec.hpp): [kind, cp, seq_len, padded_len,
# local_len, fragments per rank, then (begin, end) pairs in rank order].
CONTIGUOUS_7_CP3 = torch.tensor([0, 3, 7, 9, 3, 1, 1, 1, 0, 3, 3, 6, 6, 9])
HEAD_TAIL_7_CP2 = torch.tensor([1, 2, 7, 8, 4, 2, 1, 0, 2, 6, 8, 2, 6])


@pytest.mark.parametrize("plan, rank, local_len", [(CONTIGUOUS_7_CP3, 2, 3),
                                                   (HEAD_TAIL_7_CP2, 0, 4)])
def test_cut_spliced(plan, rank, local_len):
    spliced = torch.randn(2, 7, 3, requires_grad=True)
    torch.library.opcheck(torch.ops.cpkit.cut_spliced, (spliced, plan, rank, 2, local_len, 0.0))
    torch.library.opcheck(torch.ops.cpkit.cut_spliced_backward,
                          (torch.randn(2, local_len, 3), plan, rank, 7))


def test_restore_index_and_fragments_of_a_plan():
    local = torch.zeros(1, 4)
    torch.library.opcheck(torch.ops.cpkit.restore_index, (HEAD_TAIL_7_CP2, local))
    # Rank 0 holds [0, 2) and [6, 8), rank 1 [2, 6): gathered = 0 1 6 7 2 3 4 5.
    assert torch.ops.cpkit.restore_index(HEAD_TAIL_7_CP2, local).tolist() == [0, 1, 4, 5, 6, 7, 2, 3]
    # A value of the wrong shape is named as restore_order's input, not as a gather's dim.
    with pytest.raises(ValueError, match=r"argument 'local'.*\[4\].*\[rows, 4, \.\.\.\]"):
        cpkit.restore_order(torch.zeros(4), HEAD_TAIL_7_CP2)
    assert torch.ops.cpkit.layout_fragments(HEAD_TAIL_7_CP2, 0) == [7, 8, 4, 0, 2, 6, 8]
    assert torch.ops.cpkit.shard_layout(7, 2, 0, 1, "head_tail") == [7, 8, 4, 0, 2, 6, 8]
    with pytest.raises(ValueError, match="argument 'layout'.*rank 1 owns 3 tokens"):
        torch.ops.cpkit.restore_index(torch.tensor([1, 2, 7, 8, 4, 2, 1, 0, 2, 6, 8, 2, 5]),
                                      local)
