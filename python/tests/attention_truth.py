"""Attention written out in torch for the tests (docs/spec.md sections 3 and 4b): a dense
[H, T, T] score matrix in the inputs' dtype, section 3's mask from a whole row's positions,
document ids and padding, the sliding window, GQA by repeating key heads, the soft cap and
per-head sinks as an extra softmax column. Independent of cpkit's plan and kernels."""

from __future__ import annotations

import math

import torch


def attention(q, k, v, whole, window=0, scale=0.0, softcap=0.0, sinks=None):
    """q [T, Hq, D], k and v [T, Hkv, D]; ``whole``: the row's ``position_ids``,
    ``document_ids`` and ``padding`` ([T] each). Returns (out [T, Hq, D], lse [Hq, T])."""
    pos, doc, pad = (whole[key].flatten() for key in ("position_ids", "document_ids", "padding"))
    visible = ((doc[:, None] > 0) & (doc[:, None] == doc[None, :]) & (pos[None, :] <= pos[:, None])
               & ~pad[None, :])
    if window > 0:
        visible &= pos[:, None] - pos[None, :] < window
    group = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = torch.einsum("ihd,jhd->hij", q, kk) * (scale or 1 / math.sqrt(q.shape[-1]))
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    scores = scores.masked_fill(~visible, -math.inf)
    if sinks is not None:
        scores = torch.cat([scores, sinks.view(-1, 1, 1).expand(-1, scores.shape[1], 1)], 2)
    lse = torch.logsumexp(scores, 2)
    probs = torch.exp(scores - lse[..., None]).nan_to_num(0.0)
    if sinks is not None:
        probs = probs[..., :-1]
    return torch.einsum("hij,jhd->ihd", probs, vv), lse
