"""The torchrun checks of what moves tokens (run by cp_worker.py): gather_tokens, sharding,
the varlen offsets, the layouts' streams and cp_attention, each against plain PyTorch on the
unsharded batch."""

from __future__ import annotations

import torch

import cpkit
from attention_truth import attention
from cp_support import cp_group, shard_for_check
from cpkit._mesh import group_name as _group_name
from test_offsets import masked, varlen
from test_opcheck import opcheck_shard


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
    sharder = shard_for_check(batch, packed, mesh, layout_kind)
    whole = shard_for_check(batch, packed, None)
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
    eager = shard_for_check(with_embeds, packed, mesh, layout_kind)
    lazy = shard_for_check(with_embeds, packed, mesh, layout_kind, shard_primary=False)
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
    sharder = shard_for_check(batch, True, mesh, layout_kind)
    whole = shard_for_check(batch, True, None)
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
