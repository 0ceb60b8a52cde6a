"""The torchrun checks of the losses through cpkit (run by cp_worker.py): shifted_cp_loss,
shifted_cp_linear_loss and token_logprobs on each rank's shard against plain PyTorch on the
unsharded batch, for every layout."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

import cpkit
from cp_support import (IGNORE, cp_group, mean_over_ranks, shard_for_check, single_device_loss,
                        truth_labels)


def check_loss(batch: dict, packed: bool, mesh, rank: int, cp: int, vocab: int, seed: int,
               softcap: float = 0.0, layout_kind: str = "contiguous") -> None:
    sharder = shard_for_check(batch, packed, mesh, layout_kind)
    for m in range(sharder.num_microbatches):
        layout = sharder.layout(m)
        local = sharder.local(m)
        positions = sharder.positions(m)  # this rank's tokens of the global sequence
        rows, length = local["labels"].shape
        generator = torch.Generator().manual_seed(seed + m)
        global_logits = torch.randn(rows, layout["padded_len"], vocab, generator=generator) * 3
        logits = global_logits[:, positions].contiguous().requires_grad_(True)
        loss = cpkit.shifted_cp_loss(logits, local["labels"], local["valid"], mesh, softcap=softcap,
                                     layout=local["layout"])
        loss.backward()
        # The truth: plain PyTorch on the unsharded microbatch.
        truth_logits = global_logits[:, :layout["seq_len"]].clone().requires_grad_(True)
        capped = softcap * torch.tanh(truth_logits / softcap) if softcap > 0 else truth_logits
        truth = single_device_loss(capped, truth_labels(batch, packed, m))
        truth.backward()
        torch.testing.assert_close(mean_over_ranks(loss, mesh, cp), truth.detach(), rtol=1e-5, atol=1e-6)
        # Gradients: the CP / N scale means rank gradients are averaged: grad_r / CP = truth.
        expected = torch.zeros(rows, layout["padded_len"], vocab)
        expected[:, :layout["seq_len"]] = truth_logits.grad
        torch.testing.assert_close(logits.grad / cp, expected[:, positions], rtol=1e-4, atol=1e-7)


def check_linear_loss(batch: dict, packed: bool, mesh, rank: int, cp: int, vocab: int, seed: int,
                      softcap: float = 0.0, chunk_rows: int = 0,
                      layout_kind: str = "contiguous") -> None:
    """The fused LM head against plain PyTorch: the head's matmul, then the loss on the whole
    microbatch; d weight summed over ranks (as FSDP's reduce does) / CP = the truth's."""
    sharder = shard_for_check(batch, packed, mesh, layout_kind)
    hidden_size = 12
    weight = torch.randn(vocab, hidden_size, generator=torch.Generator().manual_seed(seed)) * 0.8
    for m in range(sharder.num_microbatches):
        layout = sharder.layout(m)
        local = sharder.local(m)
        rows = local["labels"].shape[0]
        generator = torch.Generator().manual_seed(seed + 100 + m)
        global_hidden = torch.randn(rows, layout["padded_len"], hidden_size, generator=generator)
        positions = sharder.positions(m)
        hidden = global_hidden[:, positions].clone().requires_grad_(True)
        w = weight.clone().requires_grad_(True)
        loss = cpkit.shifted_cp_linear_loss(hidden, w, local["labels"], local["valid"], mesh,
                                            softcap=softcap, chunk_rows=chunk_rows,
                                            layout=local["layout"])
        loss.backward()
        truth_hidden = global_hidden[:, :layout["seq_len"]].clone().requires_grad_(True)
        truth_w = weight.clone().requires_grad_(True)
        logits = truth_hidden @ truth_w.T
        capped = softcap * torch.tanh(logits / softcap) if softcap > 0 else logits
        truth = single_device_loss(capped, truth_labels(batch, packed, m))
        truth.backward()
        torch.testing.assert_close(mean_over_ranks(loss, mesh, cp), truth.detach(), rtol=1e-5, atol=1e-6)
        dweight = w.grad.clone()
        dist.all_reduce(dweight, group=cp_group(mesh))
        torch.testing.assert_close(dweight / cp, truth_w.grad, rtol=1e-4, atol=1e-6)
        expected = torch.zeros(rows, layout["padded_len"], hidden_size)
        expected[:, :layout["seq_len"]] = truth_hidden.grad
        torch.testing.assert_close(hidden.grad / cp, expected[:, positions], rtol=1e-4, atol=1e-6)


def check_token_logprobs(batch: dict, packed: bool, mesh, rank: int, cp: int, vocab: int,
                         seed: int, softcap: float = 0.0, temperature: float = 1.0,
                         layout_kind: str = "contiguous") -> None:
    """token_logprobs against F.log_softmax in fp64 on the unsharded microbatch (values in
    global order through restore_order), and a GRPO-style clipped-ratio loss built from them:
    its gradients, summed over ranks, are the single-device ones."""
    sharder = shard_for_check(batch, packed, mesh, layout_kind)
    hidden_size = 12
    weight = torch.randn(vocab, hidden_size, generator=torch.Generator().manual_seed(seed)) * 1.5
    for m in range(sharder.num_microbatches):
        layout, local = sharder.layout(m), sharder.local(m)
        rows, S = local["labels"].shape[0], layout["seq_len"]
        generator = torch.Generator().manual_seed(seed + 100 + m)
        global_hidden = torch.randn(rows, layout["padded_len"], hidden_size, generator=generator)
        advantages = torch.randn(rows, 1, generator=generator)
        positions = sharder.positions(m)
        # The truth: fp64 on the unsharded microbatch, position t predicting labels[t + 1].
        truth_hidden = global_hidden[:, :S].double().requires_grad_(True)
        truth_w = weight.double().requires_grad_(True)
        z = truth_hidden @ truth_w.T
        z = (softcap * torch.tanh(z / softcap) if softcap > 0 else z) / temperature
        log_p = F.log_softmax(z, dim=-1)
        targets = torch.full((rows, S), IGNORE)
        targets[:, :-1] = truth_labels(batch, packed, m)[:, 1:]
        has = targets != IGNORE
        truth_lp = log_p.gather(-1, targets.clamp_min(0).unsqueeze(-1)).squeeze(-1) * has
        truth_ent = -(log_p.exp() * log_p).sum(-1) * has
        noise = 0.3 * torch.randn(rows, S, generator=generator, dtype=torch.float64)
        old = ((truth_lp + noise) * has).detach()  # the rollout's log-probabilities

        def grpo(lp: torch.Tensor, old_lp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            ratio = torch.exp(lp - old_lp)
            clipped = torch.clamp(ratio, 0.8, 1.2)
            per_token = -torch.minimum(ratio * advantages, clipped * advantages) * mask
            return per_token.sum() / has.sum()  # over the global count: ranks' terms add up

        grpo(truth_lp, old, has).backward()
        hidden = global_hidden[:, positions].clone().requires_grad_(True)
        w = weight.clone().requires_grad_(True)
        out = cpkit.token_logprobs(hidden, w, local["labels"], local["valid"], mesh,
                                   softcap=softcap, temperature=temperature, entropy=True,
                                   chunk_rows=5, layout=local["layout"])
        got_lp = cpkit.restore_order(out.logprobs.detach(), local["layout"], mesh)[:, :S]
        got_ent = cpkit.restore_order(out.entropy.detach(), local["layout"], mesh)[:, :S]
        got_has = cpkit.restore_order(out.has_target.long(), local["layout"], mesh)[:, :S]
        torch.testing.assert_close(got_has.bool(), has)
        torch.testing.assert_close(got_lp.double(), truth_lp.detach(), rtol=1e-5, atol=2e-5)
        torch.testing.assert_close(got_ent.double(), truth_ent.detach(), rtol=1e-5, atol=2e-5)
        old_local = torch.zeros(rows, layout["padded_len"], dtype=torch.float64)
        old_local[:, :S] = old
        grpo(out.logprobs, old_local[:, positions].float(), out.has_target).backward()
        dweight = w.grad.clone()
        dist.all_reduce(dweight, group=cp_group(mesh))
        torch.testing.assert_close(dweight.double(), truth_w.grad, rtol=1e-4, atol=1e-6)
        expected = torch.zeros(rows, layout["padded_len"], hidden_size, dtype=torch.float64)
        expected[:, :S] = truth_hidden.grad
        torch.testing.assert_close(hidden.grad.double(), expected[:, positions], rtol=1e-4,
                                   atol=1e-6)
