"""The torchrun checks of failure and compilation (run by cp_worker.py): ranks that disagree
raise together, a dead peer is named, and the ops compile under torch.compile."""

from __future__ import annotations

import os
import time

import torch
from torch.distributed.device_mesh import init_device_mesh

import cpkit
from attention_truth import attention


def expect_disagreement(mesh, rank: int, cp: int, call, argument: str, *parts: str) -> None:
    """``call(differs)`` with ``differs`` true on the last rank raises CPError on every rank
    within a second, naming ``argument``, this rank and each of ``parts``; the next collective
    works (the group is not broken)."""
    began = time.monotonic()
    try:
        call(rank == cp - 1)
    except cpkit.CPError as error:
        message = str(error)
        assert time.monotonic() - began < 1.0, f"took {time.monotonic() - began:.2f} s: {message}"
        assert f"argument '{argument}'" in message, message
        assert f"rank {rank}" in message, message
        for part in parts:
            assert part in message, (part, message)
    else:
        raise AssertionError(f"ranks that disagree on {argument} did not raise")
    after = cpkit.gather_tokens(torch.tensor([rank]), mesh, differentiable=False)
    assert after.tolist() == list(range(cp)), after


def check_errors(mesh, rank: int, cp: int) -> None:
    try:
        cpkit.gather_tokens(torch.zeros(rank + 1, 2), mesh)  # counts differ across ranks
    except cpkit.CPError as error:
        assert "argument 'value'" in str(error), error
    else:
        raise AssertionError("mismatched counts did not raise")
    vocab, gen = 32, torch.Generator().manual_seed(5)

    def loss(B: int, L: int, V: int) -> None:
        labels = torch.randint(0, V, (B, L), generator=gen)
        cpkit.shifted_cp_loss(torch.randn(B, L, V), labels, torch.ones(B * L, dtype=torch.bool),
                              mesh)

    def batch(seed: int) -> dict:
        ids = torch.randint(1, vocab, (2, 12), generator=torch.Generator().manual_seed(seed))
        return {"input_ids": ids, "labels": ids.clone()}

    expect_disagreement(
        mesh, rank, cp,
        lambda differs: cpkit.gather_tokens(torch.zeros(3, 2, dtype=torch.float64 if differs
                                                        else torch.float32), mesh),
        "value", "the dtype", "Double", "Float")
    expect_disagreement(mesh, rank, cp, lambda differs: loss(2, 9 if differs else 8, vocab),
                        "logits", "the local length L", " 8 ", " 9 ")
    expect_disagreement(mesh, rank, cp, lambda differs: loss(2, 8, vocab + differs),
                        "logits", "the vocabulary size V", "32", "33")
    expect_disagreement(
        mesh, rank, cp,
        lambda differs: cpkit.shifted_cp_linear_loss(
            torch.randn(1, 4, 8), torch.randn(vocab + differs, 8),
            torch.randint(0, vocab, (1, 4), generator=gen), torch.ones(4, dtype=torch.bool), mesh),
        "weight", "the vocabulary size V")
    expect_disagreement(mesh, rank, cp,
                        lambda differs: cpkit.gather_tokens(torch.zeros(4, 4), mesh, dim=int(differs)),
                        "dim", "the gather dim")
    # A data loader seeded per rank: same shapes, other tokens.
    expect_disagreement(mesh, rank, cp,
                        lambda differs: cpkit.prepare_cp_inputs(batch(7 + differs), mesh=mesh),
                        "input_ids", "holds different values", "same global batch")
    try:
        cpkit.shifted_cp_linear_loss(torch.randn(1, 4, 8), torch.randn(vocab, 8),
                                     torch.zeros(1, 4, dtype=torch.long),
                                     torch.ones(4, dtype=torch.bool), mesh, softcap=-1.0)
    except cpkit.CPError as error:
        assert "argument 'softcap'" in str(error), error
    else:
        raise AssertionError("softcap=-1 did not raise")


def check_compile(mesh, rank: int, cp: int) -> None:
    """torch.compile(fullgraph=True) of a CP step: the same values and gradients as eager for
    loss.backward(), a scaled upstream ((0.5 * loss).backward(), loss weighting) and gradient
    accumulation over 3 microbatches ((loss / 3).backward() each, one set of leaves)."""

    def step(k: torch.Tensor, logits: torch.Tensor, labels: torch.Tensor, valid: torch.Tensor):
        keys = cpkit.gather_tokens(k, mesh, differentiable=True)
        loss = cpkit.shifted_cp_loss(logits + keys.sum() * 0.01, labels, valid, mesh, softcap=20.0)
        return loss

    generator = torch.Generator().manual_seed(7 + rank)
    microbatches = [(torch.randn(4, 3, generator=generator),
                     torch.randn(1, 4, 11, generator=generator),
                     torch.randint(0, 11, (1, 4), generator=generator)) for _ in range(3)]
    valid = torch.tensor([rank > 0, True, True, False])

    def run(function, scale: float, count: int) -> list[torch.Tensor]:
        k_in = microbatches[0][0].clone().requires_grad_(True)
        logits_in = microbatches[0][1].clone().requires_grad_(True)
        losses = []
        for k, logits, labels in microbatches[:count]:
            # Accumulation: the same leaves (a model's weights) take every microbatch's data.
            loss = function(k_in + (k - microbatches[0][0]), logits_in + (logits - microbatches[0][1]),
                            labels, valid)
            (loss * scale).backward()
            losses.append(loss.detach())
        return [*losses, k_in.grad, logits_in.grad]

    compiled = torch.compile(step, fullgraph=True)
    for scale, count in ((1.0, 1), (0.5, 1), (1.0 / 3, 3)):
        for eager, traced in zip(run(step, scale, count), run(compiled, scale, count)):
            torch.testing.assert_close(traced, eager, rtol=1e-5, atol=1e-6,
                                       msg=lambda m: f"scale {scale}, {count} microbatches: {m}")

    # Keys gathered along the sequence dim of [B, H, S, D] inside an attention-like step.
    def attention(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        keys = cpkit.gather_tokens(k, mesh, dim=2)
        return (q @ keys.transpose(-1, -2)).softmax(-1).sum()

    q = torch.randn(1, 2, 3, 4, generator=generator)
    k = torch.randn(1, 2, 3, 4, generator=generator)
    grads = []
    for function in (attention, torch.compile(attention, fullgraph=True)):
        k_in = k.clone().requires_grad_(True)
        (0.5 * function(q, k_in)).backward()
        grads.append(k_in.grad)
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-5, atol=1e-6)


def check_dead_peer_in_loss(rank: int, cp: int, timeout_s: float) -> None:
    """The last rank exits in the middle of training, right before the loss's exchange; every
    other rank raises CPError naming the mesh and the timeout, within a few timeouts."""
    mesh = init_device_mesh("cpu", (cp,), mesh_dim_names=("cp",))
    cpkit.gather_tokens(torch.ones(2), mesh)  # mid-training: the group has run a collective
    if rank == cp - 1:
        os._exit(0)
    began = time.monotonic()
    try:
        cpkit.shifted_cp_loss(torch.randn(1, 4, 8), torch.zeros(1, 4, dtype=torch.long),
                              torch.ones(4, dtype=torch.bool), mesh)
    except cpkit.CPError as error:
        message = str(error)
        assert "argument 'mesh'" in message and "a peer died" in message, message
        assert time.monotonic() - began < 5 * timeout_s, message
    else:
        raise AssertionError("no error although the last rank is gone")
    print(f"rank {rank}/{cp}: dead peer raised", flush=True)
    os._exit(0)  # the group lost a member: skip its teardown
