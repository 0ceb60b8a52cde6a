"""Varlen attention offsets from Python: a FlashAttention-style varlen attention (causal,
bottom-right aligned) driven by each rank's offsets equals masked attention over the whole
row on every real query, for packed documents straddling ranks, empty documents, slot
padding and a row tail, and for BSHD rows with left and right padding."""

from __future__ import annotations

import math

import pytest
import torch

import cpkit


def varlen(q, k, v, cu_q, cu_k):
    """FlashAttention's varlen semantics, written out: query a of a segment of m queries and
    n keys sees keys j <= a + n - m."""
    out = torch.zeros_like(q)
    for i in range(len(cu_q) - 1):
        q0, q1, k0, k1 = int(cu_q[i]), int(cu_q[i + 1]), int(cu_k[i]), int(cu_k[i + 1])
        m, n = q1 - q0, k1 - k0
        if m == 0:
            continue
        scores = q[q0:q1] @ k[k0:k1].T / math.sqrt(q.shape[-1])
        visible = torch.arange(n)[None, :] <= torch.arange(m)[:, None] + n - m
        out[q0:q1] = torch.softmax(scores.masked_fill(~visible, -math.inf), -1) @ v[k0:k1]
    return out


def masked(q, k, v, whole):
    pos, doc, pad = (whole[key].flatten() for key in ("position_ids", "document_ids", "padding"))
    allowed = ((doc[:, None] > 0) & (doc[:, None] == doc[None, :]) & (pos[None, :] <= pos[:, None])
               & ~pad[None, :])
    scores = (q @ k.T / math.sqrt(q.shape[-1])).masked_fill(~allowed, -math.inf)
    probs = torch.where(allowed.any(1, keepdim=True), torch.softmax(scores.nan_to_num(-1e9), -1), 0)
    return probs @ v


def offsets(batch, fmt, cp, rank):
    cu_q, cu_k, scalars, _ = torch.ops.cpkit.attention_offsets(
        batch.get("input_ids"), None, batch["labels"], None, batch.get("attention_mask"),
        batch.get("seq_lens"), batch.get("seq_lens_padded"), fmt, cp, rank, 1, 1, 0)
    assert cu_q.dtype == torch.int32 and cu_k.dtype == torch.int32
    return cu_q, cu_k, dict(zip(("max_q", "max_k", "k_begin", "k_end"), scalars.tolist()))


@pytest.mark.parametrize("cp", [1, 2, 3, 5])
@pytest.mark.parametrize("fmt", ["thd", "bshd"])
def test_varlen_from_offsets_equals_masked_attention(cp, fmt):
    T = 23
    batch = {"input_ids": torch.ones(1, T, dtype=torch.long),
             "labels": torch.ones(1, T, dtype=torch.long), "qkv_format": fmt}
    if fmt == "thd":
        batch["seq_lens"] = torch.tensor([[9, 0, 4, 6]])
        batch["seq_lens_padded"] = torch.tensor([[10, 1, 4, 6]])
        prepare = cpkit.prepare_packed_cp_inputs
    else:
        batch["attention_mask"] = torch.tensor([[0] * 3 + [1] * 17 + [0] * 3])
        prepare = lambda b, n: cpkit.prepare_cp_inputs(b, n)  # noqa: E731
    whole = prepare(batch, 1)
    layout_pad = torch.ops.cpkit.shard_layout(T, cp, 0, 1)[1]
    whole_padded = {key: torch.nn.functional.pad(whole.local(0)[key], (0, layout_pad - T),
                                                 value=0 if key != "padding" else True)
                    for key in ("position_ids", "document_ids", "padding")}
    g = torch.Generator().manual_seed(cp)
    q, k, v = (torch.randn(layout_pad, 4, generator=g, dtype=torch.float64) for _ in range(3))
    expected = masked(q, k, v, whole_padded)
    L = layout_pad // cp
    for rank in range(cp):
        cu_q, cu_k, s = offsets(batch, fmt, cp, rank)
        begin = rank * L
        assert s["k_end"] == begin + L and int(cu_q[-1]) == L
        got = varlen(q[begin:begin + L], k[s["k_begin"]:s["k_end"]], v[s["k_begin"]:s["k_end"]],
                     cu_q, cu_k)
        real = ~whole_padded["padding"].flatten()[begin:begin + L]
        torch.testing.assert_close(got[real], expected[begin:begin + L][real])
        assert s["max_q"] == int((cu_q[1:] - cu_q[:-1]).max())
        assert s["max_k"] == int((cu_k[1:] - cu_k[:-1]).max())


@pytest.mark.parametrize("cp,layout,slots", [(2, "head_tail", [24]), (3, "head_tail", [5, 15, 4]),
                                              (2, "balanced", [300, 40, 12]),
                                              (3, "balanced", [400, 9, 23])])
def test_varlen_over_k_index_equals_masked_attention(cp, layout, slots):
    """Layouts other than contiguous pick each rank's keys from the rank-order gather with
    k_index. On rows where a rank holds several pieces of one document (head_tail's head and
    tail, balanced's long documents cut head-tail), so that k_index lists a prefix more than
    once, varlen attention over the picked keys equals masked attention over the row."""
    T = sum(slots)
    doc = torch.repeat_interleave(torch.arange(len(slots)), torch.tensor(slots))
    whole = {"position_ids": torch.arange(T), "document_ids": doc + 1,
             "padding": torch.zeros(T, dtype=torch.bool)}
    batch = {"input_ids": torch.ones(1, T, dtype=torch.long),
             "labels": torch.ones(1, T, dtype=torch.long), "seq_lens": torch.tensor([slots]),
             "seq_lens_padded": torch.tensor([slots]), "qkv_format": "thd"}
    g = torch.Generator().manual_seed(cp)
    q, k, v = (torch.randn(T, 4, generator=g, dtype=torch.float64) for _ in range(3))
    expected = masked(q, k, v, whole)
    positions = []
    for rank in range(cp):
        summary = torch.ops.cpkit.shard_layout(T, cp, rank, 1, layout, slots)
        assert summary[1] == T, "the case needs no padding"
        pairs = summary[3:]
        positions.append(torch.cat([torch.arange(pairs[i], pairs[i + 1])
                                    for i in range(0, len(pairs), 2)]))
    gathered_k, gathered_v = (torch.cat([t[p] for p in positions]) for t in (k, v))
    repeated = 0
    for rank in range(cp):
        cu_q, cu_k, _, k_index = torch.ops.cpkit.attention_offsets(
            batch["input_ids"], None, batch["labels"], None, None, batch["seq_lens"],
            batch["seq_lens_padded"], "thd", cp, rank, 1, 1, 0, layout)
        repeated += k_index.numel() - k_index.unique().numel()
        got = varlen(q[positions[rank]], gathered_k[k_index], gathered_v[k_index], cu_q, cu_k)
        torch.testing.assert_close(got, expected[positions[rank]], msg=f"rank {rank}")
    assert repeated > 0, "no rank held two pieces of one document"


@pytest.mark.parametrize("cp", [2, 3])
def test_rows_whose_documents_start_apart_skip_keys_in_empty_query_segments(cp):
    """BSHD rows with different left padding: every row's keys are the slice [k_begin, k_end)
    of its gathered row, so a row whose document starts after k_begin needs a segment of 0
    queries over the keys it skips. Varlen over the rows flattened equals each row's masked
    attention on every real query."""
    T = 24
    mask = torch.tensor([[0] * 3 + [1] * 21, [0] * 14 + [1] * 10, [1] * 24])
    batch = {"input_ids": torch.ones(3, T, dtype=torch.long),
             "labels": torch.ones(3, T, dtype=torch.long), "attention_mask": mask,
             "qkv_format": "bshd"}
    whole = cpkit.prepare_cp_inputs(batch, 1).local(0)
    padded = torch.ops.cpkit.shard_layout(T, cp, 0, 1)[1]
    rows = [{key: torch.nn.functional.pad(whole[key][b], (0, padded - T),
                                          value=0 if key != "padding" else True)
             for key in ("position_ids", "document_ids", "padding")} for b in range(3)]
    g = torch.Generator().manual_seed(cp)
    q, k, v = (torch.randn(3, padded, 4, generator=g, dtype=torch.float64) for _ in range(3))
    L, empty_segments = padded // cp, 0
    for rank in range(cp):
        cu_q, cu_k, s = offsets(batch, "bshd", cp, rank)
        begin = rank * L
        empty_segments += int(((cu_q[1:] - cu_q[:-1]) == 0).sum())
        keys = [t[:, s["k_begin"]:s["k_end"]].reshape(-1, 4) for t in (k, v)]
        got = varlen(q[:, begin:begin + L].reshape(-1, 4), *keys, cu_q, cu_k).view(3, L, 4)
        for b in range(3):
            expected = masked(q[b], k[b], v[b], rows[b])[begin:begin + L]
            real = ~rows[b]["padding"][begin:begin + L]
            torch.testing.assert_close(got[b][real], expected[real], msg=f"rank {rank} row {b}")
    assert empty_segments > 0, "the case never needed a segment without queries"


def test_packed_local_dict_carries_the_offsets():
    batch = {"input_ids": torch.ones(1, 8, dtype=torch.long),
             "labels": torch.ones(1, 8, dtype=torch.long),
             "seq_lens": torch.tensor([[3, 5]]), "seq_lens_padded": torch.tensor([[3, 5]]),
             "qkv_format": "thd"}
    local = cpkit.prepare_packed_cp_inputs(batch, 1).local(0)
    assert local["cu_seqlens_q"].tolist() == [0, 3, 8]
    assert local["cu_seqlens_k"].tolist() == [0, 3, 8]
    assert (local["max_seqlen_q"], local["max_seqlen_k"], local["k_begin"], local["k_end"]) == \
        (5, 5, 0, 8)


def test_a_hole_in_the_mask_is_named():
    batch = {"input_ids": torch.ones(1, 6, dtype=torch.long),
             "labels": torch.ones(1, 6, dtype=torch.long),
             "attention_mask": torch.tensor([[1, 1, 0, 1, 1, 1]])}
    sharder = cpkit.prepare_cp_inputs(batch)
    with pytest.raises(cpkit.CPError, match="argument 'attention_mask'.*between real tokens"):
        sharder.attention_offsets(0)


def test_balance_slack_reaches_every_plan():
    """docs/spec.md 2b by hand, CP 2, documents of 500 and 100 (L 300): with a slack of 10 the
    first candidate (pieces of 2L / 2 = 300, so neither document is cut over ranks) is the plan:
    the 500-token document fills rank 0 (no rank has room for it whole), rank 1 takes its last
    200 tokens and then the 100-token one (work 1.31x the mean). With 0 a more even candidate
    cuts it head-tail. The attention offsets plan with the same slack."""
    slots, T = [500, 100], 600

    def fragments(rank, slack):
        return torch.ops.cpkit.shard_layout(T, 2, rank, 1, "balanced", slots, slack)[3:]

    assert [fragments(0, 10.0), fragments(1, 10.0)] == [[0, 300], [300, 600]]
    assert len(fragments(0, 0.0)) > 2, "the most even plan cuts the long document"
    assert fragments(0, None) == fragments(0, 0.02)  # None: the library's default
    batch = {"labels": torch.ones(1, T, dtype=torch.long), "seq_lens": torch.tensor([slots])}
    cu_q, _, _, _ = torch.ops.cpkit.attention_offsets(
        batch["labels"], None, batch["labels"], None, None, batch["seq_lens"], batch["seq_lens"],
        "thd", 2, 0, 1, 1, 0, "balanced", 10.0)
    assert cu_q.tolist() == [0, 300], "rank 0's one segment: the first 300 of the 500"
    with pytest.raises(ValueError, match="argument 'balance_slack'"):  # the op's own error
        fragments(0, -1.0)
