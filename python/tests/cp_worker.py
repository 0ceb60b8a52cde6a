"""One rank of a CP world started by torchrun (gloo on CPU), checking cpkit against plain
PyTorch on the unsharded batch. Run by test_torchrun.py:
    torchrun --standalone --nproc_per_node=N cp_worker.py
Every check raises on a difference; the exit code tells the test."""

from __future__ import annotations

import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh

import cpkit
from attention_truth import attention
from cpkit._mesh import group_name as _group_name
from test_offsets import masked, varlen
from test_opcheck import opcheck_shard
import torchrun_exit

IGNORE = -100


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


def check_loss(batch: dict, packed: bool, mesh, rank: int, cp: int, vocab: int, seed: int,
               softcap: float = 0.0, layout_kind: str = "contiguous") -> None:
    prepare = cpkit.prepare_packed_cp_inputs if packed else cpkit.prepare_cp_inputs
    chunks = batch["labels"].shape[0] if packed else 1
    sharder = prepare(batch, chunks, mesh=mesh, layout=layout_kind)
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
    prepare = cpkit.prepare_packed_cp_inputs if packed else cpkit.prepare_cp_inputs
    chunks = batch["labels"].shape[0] if packed else 1
    sharder = prepare(batch, chunks, mesh=mesh, layout=layout_kind)
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
    prepare = cpkit.prepare_packed_cp_inputs if packed else cpkit.prepare_cp_inputs
    chunks = batch["labels"].shape[0] if packed else 1
    sharder = prepare(batch, chunks, mesh=mesh, layout=layout_kind)
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


def check_gather(mesh, rank: int, cp: int) -> None:
    value = (torch.arange(6, dtype=torch.float32).view(3, 2) + 10 * rank).requires_grad_(True)
    gathered = cpkit.gather_tokens(value, mesh, differentiable=True)
    expected = torch.cat([torch.arange(6, dtype=torch.float32).view(3, 2) + 10 * r for r in range(cp)])
    torch.testing.assert_close(gathered, expected, rtol=0, atol=0)
    # Upstream weighted by the receiving rank: the owner's gradient sums over all ranks.
    upstream = torch.ones_like(gathered).t().contiguous().t() * (rank + 1)  # transposed layout
    gathered.backward(upstream)
    torch.testing.assert_close(value.grad, torch.full_like(value, cp * (cp + 1) / 2))
    metadata = cpkit.gather_tokens(torch.tensor([rank]), mesh, differentiable=False)
    assert metadata.tolist() == list(range(cp)), metadata
    # Every dtype torch.distributed.all_gather moves; float64 differentiably too.
    for dtype in (torch.float64, torch.int32, torch.int8, torch.float8_e4m3fn):
        got = cpkit.gather_tokens(torch.full((2, 3), rank + 1).to(dtype), mesh)
        assert got.dtype == dtype and got.double().tolist() == [[r + 1] * 3 for r in range(cp)
                                                                 for _ in range(2)], (dtype, got)
    wide = torch.full((2, 3), float(rank), dtype=torch.float64, requires_grad=True)
    cpkit.gather_tokens(wide, mesh).sum().backward()
    assert wide.grad.dtype == torch.float64 and torch.equal(wide.grad, torch.full_like(wide, cp))
    # Along the sequence dim of [B, H, S, D] keys (dim 2 and -2): the concatenation in rank
    # order, and the backward sums every rank's upstream slice of this rank's tokens.
    def keys_of(r: int) -> torch.Tensor:
        return torch.randn(2, 3, 4, 5, generator=torch.Generator().manual_seed(40 + r))

    def upstream_of(r: int) -> torch.Tensor:
        return torch.randn(2, 3, 4 * cp, 5, generator=torch.Generator().manual_seed(80 + r))

    for dim in (2, -2):
        k = keys_of(rank).requires_grad_(True)
        gathered = cpkit.gather_tokens(k, mesh, dim=dim)
        torch.testing.assert_close(gathered, torch.cat([keys_of(r) for r in range(cp)], 2),
                                   rtol=0, atol=0)
        gathered.backward(upstream_of(rank))
        expected = sum(upstream_of(r)[:, :, 4 * rank:4 * (rank + 1)] for r in range(cp))
        torch.testing.assert_close(k.grad, expected)


def check_sharding(mesh, rank: int, cp: int) -> None:
    T = 23
    batch = {"input_ids": torch.arange(1, T + 1).view(1, T), "labels": torch.arange(T).view(1, T),
             "seq_lens": torch.tensor([[9, 0, 11, -1000]]),
             "seq_lens_padded": torch.tensor([[10, 1, 11, -1000]]), "qkv_format": "thd"}
    local = cpkit.prepare_packed_cp_inputs(batch, 1, mesh=mesh).local(0)
    whole = cpkit.prepare_packed_cp_inputs(batch, 1).local(0)
    # Every stream gathered back along the sequence equals the unsharded layout cut to T.
    for key in ("input_ids", "labels", "position_ids", "document_ids", "padding"):
        back = cpkit.gather_tokens(local[key].t().contiguous(), mesh, False).t()[:, :T]
        assert torch.equal(back, whole[key]), (key, back, whole[key])
    assert local["cu_seqlens"].tolist() == [0, 9, 9, 20]
    assert local["cu_seqlens_padded"].tolist() == [0, 10, 11, 22]
    # shard_primary=False: the in-forward cut equals the eager shard, and its gradient lands
    # on this rank's columns of the spliced embeddings.
    embeds = torch.randn(1, T, 4, generator=torch.Generator().manual_seed(5))
    eager = cpkit.prepare_packed_cp_inputs({**batch, "input_ids": None, "inputs_embeds": embeds}, 1,
                                           mesh=mesh)
    lazy = cpkit.prepare_packed_cp_inputs({**batch, "input_ids": None, "inputs_embeds": embeds}, 1,
                                          False, mesh=mesh)
    spliced = embeds.clone().requires_grad_(True)
    cut = lazy.cut_spliced(0, spliced)
    assert torch.equal(cut, eager.local(0)["inputs_embeds"])
    cut.sum().backward()
    layout = lazy.layout(0)
    expected = torch.zeros_like(embeds)
    expected[:, layout["begin"]:min(layout["end"], T)] = 1
    assert torch.equal(spliced.grad, expected)
    # Strided inputs (a collate's transposed [S, B] tensors, [:, ::2] slices) shard exactly
    # as the same batch made contiguous.
    g = torch.Generator().manual_seed(9)
    ids = torch.randint(1, 50, (T, 2), generator=g)  # collated [S, B]
    labels = torch.randint(1, 50, (2, 2 * T), generator=g)
    mask = torch.ones(2, 2 * T, dtype=torch.long)
    mask[1, :6] = 0
    strided = {"input_ids": ids.t(), "labels": labels[:, ::2],
               "attention_mask": mask[:, ::2], "position_ids": torch.arange(T).expand(2, T)}
    assert not any(strided[key].is_contiguous() for key in strided)
    contiguous = {key: value.contiguous() for key, value in strided.items()}
    got = cpkit.prepare_cp_inputs(strided, mesh=mesh).local(0)
    expected = cpkit.prepare_cp_inputs(contiguous, mesh=mesh).local(0)
    for key in expected:
        assert torch.equal(got[key], expected[key]), (key, got[key], expected[key])
    # The shard op's fake (meta) kernel against the real one at this CP size.
    opcheck_shard(_group_name(mesh))


def check_offsets(mesh, rank: int, cp: int, layout_kind: str = "contiguous") -> None:
    """Varlen attention driven by this rank's offsets, over keys gathered from every rank,
    equals masked attention over the unsharded row on every real query of this rank's shard
    (test_offsets.py's functions; a rank index from outside the CP group gives other rows).
    Other layouts than contiguous pick the keys from the gathered rows by k_index."""
    T = 23
    batch = {"input_ids": torch.ones(1, T, dtype=torch.long),
             "labels": torch.ones(1, T, dtype=torch.long), "qkv_format": "thd",
             "seq_lens": torch.tensor([[9, 0, 4, 6]]),
             "seq_lens_padded": torch.tensor([[10, 1, 4, 6]])}
    sharder = cpkit.prepare_packed_cp_inputs(batch, 1, mesh=mesh, layout=layout_kind)
    layout, offsets = sharder.layout(0), sharder.attention_offsets(0)
    positions = sharder.positions(0)
    whole = cpkit.prepare_packed_cp_inputs(batch, 1).local(0)
    pad = layout["padded_len"] - T
    whole = {key: torch.nn.functional.pad(whole[key], (0, pad), value=key == "padding")
             for key in ("position_ids", "document_ids", "padding")}
    g = torch.Generator().manual_seed(cp)
    q, k, v = (torch.randn(layout["padded_len"], 4, generator=g)
               for _ in range(3))
    keys, values = (cpkit.gather_tokens(t[positions], mesh, differentiable=False) for t in (k, v))
    if "k_index" in offsets:
        keys, values = keys[offsets["k_index"]], values[offsets["k_index"]]
    else:
        keys, values = (t[offsets["k_begin"]:offsets["k_end"]] for t in (keys, values))
    got = varlen(q[positions], keys, values, offsets["cu_seqlens_q"], offsets["cu_seqlens_k"])
    real = ~whole["padding"].flatten()[positions]
    expected = masked(q, k, v, whole)[positions]
    torch.testing.assert_close(got[real], expected[real])


def check_layout_streams(batch: dict, packed: bool, mesh, rank: int, cp: int,
                         layout_kind: str) -> None:
    """Another layout than contiguous: restore_order puts every stream back in global order
    (= the unsharded layout); its gradient reaches each rank's own tokens from every rank;
    the in-forward cut equals the eager shard and its gradient lands on the rank's tokens."""
    prepare = cpkit.prepare_packed_cp_inputs if packed else cpkit.prepare_cp_inputs
    chunks = batch["labels"].shape[0] if packed else 1
    sharder = prepare(batch, chunks, mesh=mesh, layout=layout_kind)
    whole = prepare(batch, chunks, mesh=None)
    for m in range(sharder.num_microbatches):
        local, full, plan = sharder.local(m), whole.local(m), sharder.local(m)["layout"]
        T = sharder.layout(m)["seq_len"]
        for key in ("input_ids", "labels", "position_ids", "document_ids", "padding"):
            back = cpkit.restore_order(local[key], plan, mesh)[:, :T]
            assert torch.equal(back, full[key]), (layout_kind, m, key, back, full[key])
        positions = sharder.positions(m)
        x = torch.randn(local["labels"].shape, generator=torch.Generator().manual_seed(rank))
        x.requires_grad_(True)
        weights = torch.randn(x.shape[0], sharder.layout(m)["padded_len"],
                              generator=torch.Generator().manual_seed(m))  # same on every rank
        (cpkit.restore_order(x, plan, mesh) * weights).sum().backward()
        torch.testing.assert_close(x.grad, cp * weights[:, positions])
    rows = batch["labels"].shape[0]
    embeds = torch.randn(rows, batch["labels"].shape[1], 4,
                         generator=torch.Generator().manual_seed(5))
    with_embeds = {**batch, "input_ids": None, "inputs_embeds": embeds}
    eager = prepare(with_embeds, chunks, mesh=mesh, layout=layout_kind)
    lazy = prepare(with_embeds, chunks, False, mesh=mesh, layout=layout_kind)
    for m in range(lazy.num_microbatches):
        spliced = lazy.global_primary(m).clone().requires_grad_(True)
        cut = lazy.cut_spliced(m, spliced)
        assert torch.equal(cut, eager.local(m)["inputs_embeds"]), (layout_kind, m)
        cut.sum().backward()
        expected = torch.zeros(spliced.shape[0], lazy.layout(m)["padded_len"], 4)
        expected[:, lazy.positions(m)] = 1
        assert torch.equal(spliced.grad, expected[:, :spliced.shape[1]]), (layout_kind, m)
    # The shard remembers its plan: a loss given none raises on every rank, naming layout.
    local, vocab = sharder.local(0), int(batch["labels"].max()) + 1
    try:
        cpkit.shifted_cp_loss(torch.randn(*local["labels"].shape, vocab), local["labels"],
                              local["valid"], mesh)
    except cpkit.CPError as error:
        assert "argument 'layout'" in str(error) and f'"{layout_kind}"' in str(error), error
    else:
        raise AssertionError(f"a {layout_kind} shard's loss without its plan did not raise")


def check_cp_attention(batch: dict, mesh, rank: int, cp: int, layout_kind: str,
                       window: int) -> None:
    """cp_attention on every microbatch of a packed batch against attention over the whole
    row in torch (attention_truth.py, double): this rank's outputs and the gradients of its
    own q, k, v (key gradients summed over every rank's queries) and of the sinks (this
    rank's term, summed over the ranks here)."""
    chunks = batch["labels"].shape[0]
    sharder = cpkit.prepare_packed_cp_inputs(batch, chunks, mesh=mesh, layout=layout_kind)
    whole = cpkit.prepare_packed_cp_inputs(batch, chunks, mesh=None)
    for m in range(sharder.num_microbatches):
        T = sharder.layout(m)["padded_len"]
        meta = {key: torch.nn.functional.pad(whole.local(m)[key][0], (0, T - whole.layout(m)["padded_len"]),
                                             value=key == "padding")
                for key in ("position_ids", "document_ids", "padding")}
        g = torch.Generator().manual_seed(40 + m)  # the same global tensors on every rank
        q, k, v, d_out = (torch.randn(T, h, 4, generator=g) for h in (4, 2, 2, 4))
        sinks = torch.randn(4, generator=g)
        positions = sharder.positions(m)
        mine = [t[positions].unsqueeze(0).clone().requires_grad_(True) for t in (q, k, v)]
        own_sinks = sinks.clone().requires_grad_(True)
        got = cpkit.cp_attention(*mine, sharder.attention_plan(m, window), mesh, softcap=3.0,
                                 sinks=own_sinks)
        exact = [t.double().requires_grad_(True) for t in (q, k, v, sinks)]
        want, lse = attention(*exact[:3], meta, window, 0.0, 3.0, exact[3])
        torch.testing.assert_close(got.out[0].double(), want[positions], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got.lse[0].double(), lse[:, positions], rtol=1e-5, atol=1e-5)
        grads = torch.autograd.grad(got.out, mine + [own_sinks], d_out[positions].unsqueeze(0))
        truths = torch.autograd.grad(want, exact, d_out.double())
        for name, grad, truth in zip("qkv", grads[:3], truths[:3]):
            torch.testing.assert_close(grad[0].double(), truth[positions], rtol=1e-4, atol=1e-5,
                                       msg=f"d{name}, {layout_kind}, window {window}")
        dsinks = grads[3].clone()
        torch.distributed.all_reduce(dsinks, group=cp_group(mesh))
        torch.testing.assert_close(dsinks.double(), truths[3], rtol=1e-4, atol=1e-5)


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
