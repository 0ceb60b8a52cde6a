#!/usr/bin/env python3
"""Regenerates golden/cases/*.json from an oracle that is not cpkit.

The layout (padding, positions, document ids, padding flags, valid-target mask, the cut) is
written here again, in plain Python, from docs/spec.md. Loss and gradients come from PyTorch
on the *unsharded* batch: torch.nn.functional.cross_entropy with autograd, cross-checked
against HF transformers' causal-LM loss when transformers is installed. Expected per-rank
values are then cut from those single-device results by the SPEC's layout:
  loss_r = (sum of CE over rank r's counted targets) * CP / N,
  grad_r = CP * (single-device gradient at rank r's positions).

Usage: <python with torch> golden/generate.py   (scripts/setup.sh's venv has torch)
"""
import json
import math
import pathlib

import torch
import torch.nn.functional as F

try:
    from transformers.loss.loss_utils import ForCausalLMLoss
except ImportError:  # the cross-check is optional
    ForCausalLMLoss = None

IGNORE = -100
SENTINEL = -1000
OUT = pathlib.Path(__file__).resolve().parent / "cases"
OFFSETS = pathlib.Path(__file__).resolve().parent / "offsets"
LINEAR = pathlib.Path(__file__).resolve().parent / "linear"
LOGPROBS = pathlib.Path(__file__).resolve().parent / "logprobs"
ATTENTION = pathlib.Path(__file__).resolve().parent / "attention"
POLICY = pathlib.Path(__file__).resolve().parent / "policy"


def padded_length(n, cp, pad_multiple, layout="contiguous"):
    if cp == 1:  # CP = 1 is the identity on layout
        return n
    m = cp * pad_multiple * (2 if layout == "head_tail" else 1)
    return (n + m - 1) // m * m


def layout_positions(layout, s_pad, cp, slots=None, slack=0.02):
    """Each rank's global positions, in local order (docs/spec.md section 2b, restated)."""
    L = s_pad // cp
    if cp == 1 or layout == "contiguous":
        return [list(range(r * L, (r + 1) * L)) for r in range(cp)]
    if layout == "head_tail":
        C = s_pad // (2 * cp)
        return [list(range(r * C, (r + 1) * C)) + list(range((2 * cp - 1 - r) * C, (2 * cp - r) * C))
                for r in range(cp)]
    assert layout == "balanced"
    # 1. Attention documents: slots of nonzero length, then the row tail.
    docs, start = [], 0
    for n in slots:
        if n > 0:
            docs.append((start, n))
        start += n
    if start < s_pad:
        docs.append((start, s_pad - start))
    L_tile = 128  # the tile of the cost model

    def candidate(piece):
        """2. Every document, longest first, to g ranks (head-tail) or whole."""
        owner = [None] * s_pad
        tokens, work = [0] * cp, [0] * cp

        def give(rank, doc_start, first, count):
            for t in range(doc_start + first, doc_start + first + count):
                owner[t] = rank
            tokens[rank] += count
            work[rank] += sum(offset + 1 for offset in range(first, first + count))

        for doc_start, n in sorted(docs, key=lambda d: -d[1]):
            g = min(cp, max(1, n // piece)) if piece else (cp if n >= 2 * cp * 64 else 1)
            chosen = None
            while 2 <= g <= cp:
                q, e = divmod(n, 2 * g)
                fit = [r for r in range(cp) if L - tokens[r] >= 2 * q]
                if len(fit) >= g:
                    chosen = sorted(fit, key=lambda r: (work[r], r))[:g]
                    sizes = [q] * (2 * g)
                    order = sorted(chosen, key=lambda r: (tokens[r], r))
                    for k in range(e):
                        j = chosen.index(order[k % g])
                        sizes[j if k < g else 2 * g - 1 - j] += 1
                    if all(L - tokens[r] >= sizes[j] + sizes[2 * g - 1 - j]
                           for j, r in enumerate(chosen)):
                        break
                    chosen = None
                g += 1
            if chosen:
                first = 0
                for c in range(2 * g):
                    give(chosen[c if c < g else 2 * g - 1 - c], doc_start, first, sizes[c])
                    first += sizes[c]
                continue
            fits = [r for r in range(cp) if L - tokens[r] >= n]
            if fits:
                give(min(fits, key=lambda r: (work[r], r)), doc_start, 0, n)
                continue
            first = 0
            while first < n:
                rank = max(range(cp), key=lambda r: (L - tokens[r], -r))
                take = min(L - tokens[rank], n - first)
                give(rank, doc_start, first, take)
                first += take
        return owner

    def imbalance(owner):
        """1. max / mean of the work and of the tile cost, the larger."""
        worst = 0.0
        for tile in (1, L_tile):
            cost = [0] * cp
            for doc_start, n in docs:
                a = 0
                while a < n:
                    r, e = owner[doc_start + a], a
                    while e < n and owner[doc_start + e] == r:
                        e += 1
                    for t in range(a, e, tile):
                        last = min(t + tile, e)
                        cost[r] += -(-last // tile) * tile * tile
                    a = e
            worst = max(worst, max(cost) * cp / sum(cost))
        return worst

    # 3. Pieces 2L/k from k = 2 while >= 128, then every rank; the first within the slack.
    pieces = [2 * L // k for k in range(2, 2 * L + 1) if 2 * L // k >= 128] + [0]
    best = None
    for piece in pieces:
        owner = candidate(piece)
        ratio = imbalance(owner)
        if ratio <= 1 + slack:
            best = (owner, ratio)
            break
        if best is None or ratio < best[1]:
            best = (owner, ratio)
    owned = [[] for _ in range(cp)]
    for t, r in enumerate(best[0]):
        owned[r].append(t)
    return [sorted(p) for p in owned]


def bshd_streams(ids, labels, positions, mask, s_pad, pad_id):
    """Global padded streams of one BSHD row (docs/spec.md section 2)."""
    S = len(labels)
    out = {"input_ids": [], "labels": [], "position_ids": [], "document_ids": [], "padding": [], "valid": []}
    for t in range(s_pad):
        past = t >= S
        pad = past or (mask is not None and mask[t] == 0)
        out["input_ids"].append(pad_id if past else ids[t])
        out["position_ids"].append(positions[S - 1] + (t - S + 1) if past else positions[t])
        out["document_ids"].append(0 if past else 1)
        out["padding"].append(pad)
        label = IGNORE if pad else labels[t]
        out["labels"].append(label)
        out["valid"].append((not pad) and label != IGNORE and t > 0)
    return out


def thd_streams(ids, labels, lens, slots, t_pad, pad_id):
    """Global padded streams of one packed row (docs/spec.md section 3)."""
    T = len(labels)
    out = {k: [] for k in ("input_ids", "labels", "position_ids", "document_ids", "padding", "valid")}
    docs = [(l, s) for l, s in zip(lens, slots) if l != SENTINEL]
    per_token = []
    for index, (length, slot) in enumerate(docs, start=1):
        for offset in range(slot):
            per_token.append((index, offset, offset >= length))
    while len(per_token) < t_pad:
        per_token.append((0, 0, True))
    for t, (doc, offset, pad) in enumerate(per_token):
        out["input_ids"].append(ids[t] if t < T else pad_id)
        out["document_ids"].append(doc)
        out["position_ids"].append(offset)
        out["padding"].append(pad)
        label = IGNORE if pad else labels[t]
        out["labels"].append(label)
        out["valid"].append((not pad) and label != IGNORE and offset > 0)
    return out


def truth(logits, labels, softcap):
    """HF shifted mean CE over rows [rows, S, V] with -100 ignored; per-position CE too. With
    softcap > 0 the model's cap softcap * tanh(z / softcap) comes first, differentiated by
    autograd (the gradient is w.r.t. the raw logits)."""
    x = logits.clone().requires_grad_(True)
    V = x.shape[-1]
    z = softcap * torch.tanh(x / softcap) if softcap > 0 else x
    shift_logits = z[:, :-1, :].reshape(-1, V)
    shift_labels = labels[:, 1:].reshape(-1)
    per_token = F.cross_entropy(shift_logits, shift_labels, ignore_index=IGNORE, reduction="none")
    count = int((shift_labels != IGNORE).sum())
    mean = per_token.sum() / count if count else per_token.sum() * 0.0
    mean.backward()
    if ForCausalLMLoss is not None and count:
        with torch.no_grad():
            hf = ForCausalLMLoss(z.detach().contiguous(), labels, vocab_size=V)
        assert abs(float(hf) - float(mean.detach())) < 1e-6, (float(hf), float(mean.detach()))
    ce = torch.zeros(labels.shape)
    ce[:, :-1] = per_token.detach().reshape(labels.shape[0], -1)
    return float(mean.detach()), x.grad, ce, count


def layout_case(fmt, cp, rows, S, vocab, g, num_chunks=1, pad_multiple=1, pad_id=0, docs=None,
                mask_zeros=(), ignore=(), positions_offset=None, positions=None,
                layout="contiguous"):
    """Inputs of a random batch and the global streams of each microbatch (plain Python)."""
    ids = torch.randint(1, vocab, (rows, S), generator=g).tolist()
    labels = torch.randint(0, vocab, (rows, S), generator=g).tolist()
    for (b, t) in ignore:
        labels[b][t] = IGNORE
    inputs = {"input_ids": ids, "labels": labels}
    mask = None
    explicit_positions = positions is not None or positions_offset is not None
    if positions is None:
        offset = positions_offset or 0
        positions = [[offset + (b if positions_offset is not None else 0) + t for t in range(S)]
                     for b in range(rows)]
    if fmt == "bshd":
        if mask_zeros:
            mask = [[1] * S for _ in range(rows)]
            for (b, t) in mask_zeros:
                mask[b][t] = 0
            inputs["attention_mask"] = mask
        if explicit_positions:
            inputs["position_ids"] = positions
    else:
        width = max(len(d) for d in docs)
        lens = [[l for l, _ in d] + [SENTINEL] * (width - len(d)) for d in docs]
        slots = [[l + e for l, e in d] + [SENTINEL] * (width - len(d)) for d in docs]
        inputs["seq_lens"] = lens
        inputs["seq_lens_padded"] = slots
    s_pad = padded_length(S, cp, pad_multiple, layout)
    per_mb = rows // num_chunks if fmt == "bshd" else 1
    microbatches = []
    for m in range(num_chunks):
        row_ids = list(range(m * per_mb, (m + 1) * per_mb))
        streams = []
        for b in row_ids:
            if fmt == "bshd":
                streams.append(bshd_streams(ids[b], labels[b], positions[b], mask[b] if mask else None, s_pad, pad_id))
            else:
                streams.append(thd_streams(ids[b], labels[b], lens[b], slots[b], s_pad, pad_id))
        # HF labels on the unpadded rows: -100 wherever the layout says "not a target".
        hf_labels = torch.tensor([[st["labels"][t] if st["valid"][t] else IGNORE for t in range(S)] for st in streams])
        microbatches.append((row_ids, streams, hf_labels))
    return inputs, s_pad, microbatches


def rank_loss(ce, hf_labels, owned, S, cp, count):
    """loss_r: the CE of rank r's counted targets (its global positions) times CP / N."""
    local_sum = 0.0
    for bi in range(hf_labels.shape[0]):
        for j in owned:
            if j + 1 < S and hf_labels[bi, j + 1] != IGNORE:
                local_sum += float(ce[bi, j])
    return local_sum * cp / count if count else 0.0


def rounded(t):
    return [float(f"{v:.9g}") for v in t] if t.dim() == 1 else [rounded(x) for x in t]


def make_case(name, fmt, cp, rows, S, vocab, seed, num_chunks=1, pad_multiple=1, pad_id=0,
              docs=None, mask_zeros=(), ignore=(), positions_offset=None, positions=None,
              softcap=0.0, logit_scale=3.0, layout_kind="contiguous"):
    g = torch.Generator().manual_seed(seed)
    inputs, s_pad, layout = layout_case(fmt, cp, rows, S, vocab, g, num_chunks, pad_multiple, pad_id,
                                        docs, mask_zeros, ignore, positions_offset, positions,
                                        layout_kind)
    L = s_pad // cp
    microbatches = []
    logits_all = torch.randn(rows, s_pad, vocab, generator=g) * logit_scale
    for row_ids, streams, hf_labels in layout:
        logits = logits_all[row_ids]
        mean, grad, ce, count = truth(logits[:, :S, :], hf_labels, softcap)
        slots = [x for x in inputs["seq_lens_padded"][row_ids[0]] if x != SENTINEL] \
            if fmt == "thd" else None
        ranks = []
        for r, owned in enumerate(layout_positions(layout_kind, s_pad, cp, slots)):
            g_local = torch.zeros(len(row_ids), L, vocab)
            for j, t in enumerate(owned):
                if t < S:
                    g_local[:, j, :] = grad[:, t, :] * cp
            entry = {"rank": r}
            if layout_kind == "contiguous":  # the files of the contiguous cases stay as they were
                entry.update(begin=owned[0], end=owned[-1] + 1)
            else:
                entry["positions"] = owned
            entry.update(loss=rank_loss(ce, hf_labels, owned, S, cp, count),
                         grad=[[[round(float(v), 9) for v in tok] for tok in row]
                               for row in g_local.tolist()])
            for key in ("input_ids", "labels", "position_ids", "document_ids", "padding", "valid"):
                entry[key] = [[st[key][t] for t in owned] for st in streams]
            ranks.append(entry)
        microbatches.append({
            "rows": row_ids, "padded_len": s_pad, "single_device_loss": mean, "targets": count,
            "logits": [[[float(f"{v:.9g}") for v in tok] for tok in row] for row in logits.tolist()],
            "ranks": ranks})
    case = {"name": name, "format": fmt, "cp": cp, "num_chunks": num_chunks,
            "pad_multiple": pad_multiple, "pad_token_id": pad_id, "vocab": vocab,
            "softcap": softcap, **({"layout": layout_kind} if layout_kind != "contiguous" else {}),
            "oracle": "torch.nn.functional.cross_entropy" + (" + transformers ForCausalLMLoss" if ForCausalLMLoss else ""),
            "inputs": inputs, "microbatches": microbatches}
    (OUT / f"{name}.json").write_text(json.dumps(case, indent=1) + "\n")
    return case


def make_linear_case(name, fmt, cp, rows, S, vocab, hidden_size, seed, docs=None, ignore=(),
                     softcap=0.0, head_scale=2.0):
    """shifted_cp_linear_loss (docs/spec.md section 5a): hidden [rows, S_pad, H] through the
    head weight [V, H], then the shifted loss. Each rank's expected gradients are PyTorch
    autograd of that rank's own loss term, loss_r = CP / N * (CE over its targets), on the
    unsharded batch: d hidden at its positions and its d weight."""
    g = torch.Generator().manual_seed(seed)
    inputs, s_pad, layout = layout_case(fmt, cp, rows, S, vocab, g, docs=docs, ignore=ignore)
    L = s_pad // cp
    hidden_all = torch.randn(rows, s_pad, hidden_size, generator=g)
    weight = torch.randn(vocab, hidden_size, generator=g) * (head_scale / math.sqrt(hidden_size))
    microbatches = []
    for row_ids, streams, hf_labels in layout:
        x = hidden_all[row_ids][:, :S].clone().requires_grad_(True)
        w = weight.clone().requires_grad_(True)
        z = x @ w.T
        z = softcap * torch.tanh(z / softcap) if softcap > 0 else z
        per_token = F.cross_entropy(z[:, :-1].reshape(-1, vocab), hf_labels[:, 1:].reshape(-1),
                                    ignore_index=IGNORE, reduction="none").view(len(row_ids), S - 1)
        count = int((hf_labels[:, 1:] != IGNORE).sum())
        ranks = []
        for r in range(cp):
            begin, end = r * L, (r + 1) * L
            term = per_token[:, begin:min(end, S - 1)].sum() * (cp / count if count else 0.0)
            dx, dw = torch.autograd.grad(term, (x, w), retain_graph=True, allow_unused=True)
            dx = torch.zeros_like(x) if dx is None else dx
            dw = torch.zeros_like(w) if dw is None else dw
            local = torch.zeros(len(row_ids), L, hidden_size)
            lo, hi = begin, min(end, S)
            if hi > lo:
                local[:, : hi - lo] = dx[:, lo:hi]
            ranks.append({"rank": r, "loss": float(term.detach()), "dhidden": rounded(local),
                          "dweight": rounded(dw)})
        microbatches.append({"rows": row_ids, "hidden": rounded(hidden_all[row_ids]), "ranks": ranks})
    case = {"name": name, "format": fmt, "cp": cp, "num_chunks": 1, "pad_multiple": 1,
            "pad_token_id": 0, "vocab": vocab, "hidden_size": hidden_size, "softcap": softcap,
            "oracle": "torch matmul + torch.nn.functional.cross_entropy, autograd per rank term",
            "inputs": inputs, "weight": rounded(weight), "microbatches": microbatches}
    (LINEAR / f"{name}.json").write_text(json.dumps(case, indent=1) + "\n")
    return case


def make_logprobs_case(name, fmt, cp, rows, S, vocab, hidden_size, seed, docs=None, ignore=(),
                       softcap=0.0, temperature=1.0, head_scale=2.0):
    """token_logprobs (docs/spec.md section 5b): each position's log_softmax of its next label
    and entropy, in fp64 on the unsharded batch, with z = softcap(hidden @ W^T) / t. Each
    rank's expected gradients are autograd of its own positions' sum(u_lp * lp + u_ent * H)
    for the case's upstreams u (N(0, 1), [2, rows, S_pad]): d hidden at its positions and its
    d weight."""
    g = torch.Generator().manual_seed(seed)
    inputs, s_pad, layout = layout_case(fmt, cp, rows, S, vocab, g, docs=docs, ignore=ignore)
    L = s_pad // cp
    hidden_all = torch.randn(rows, s_pad, hidden_size, generator=g)
    weight = torch.randn(vocab, hidden_size, generator=g) * (head_scale / math.sqrt(hidden_size))
    microbatches = []
    for row_ids, streams, hf_labels in layout:
        n = len(row_ids)
        upstream = torch.randn(2, n, s_pad, generator=g)
        x = hidden_all[row_ids].double().requires_grad_(True)
        w = weight.double().requires_grad_(True)
        z = x @ w.T
        z = (softcap * torch.tanh(z / softcap) if softcap > 0 else z) / temperature
        log_p = F.log_softmax(z, dim=-1)
        targets = torch.full((n, s_pad), IGNORE)
        targets[:, :S - 1] = hf_labels[:, 1:]
        has = targets != IGNORE
        lp = log_p.gather(-1, targets.clamp_min(0).unsqueeze(-1)).squeeze(-1) * has
        ent = -(log_p.exp() * log_p).sum(-1) * has
        ranks = []
        for r in range(cp):
            cols = slice(r * L, (r + 1) * L)
            term = (lp[:, cols] * upstream[0, :, cols]).sum() + \
                (ent[:, cols] * upstream[1, :, cols]).sum()
            dx, dw = torch.autograd.grad(term, (x, w), retain_graph=True)
            ranks.append({"rank": r, "logprobs": rounded(lp[:, cols].detach().float()),
                          "entropy": rounded(ent[:, cols].detach().float()),
                          "has_target": has[:, cols].tolist(),
                          "dhidden": rounded(dx[:, cols].float()), "dweight": rounded(dw.float())})
        microbatches.append({"rows": row_ids, "hidden": rounded(hidden_all[row_ids]),
                             "upstream": rounded(upstream), "ranks": ranks})
    case = {"name": name, "format": fmt, "cp": cp, "num_chunks": 1, "pad_multiple": 1,
            "pad_token_id": 0, "vocab": vocab, "hidden_size": hidden_size, "softcap": softcap,
            "temperature": temperature,
            "oracle": "torch fp64 matmul + log_softmax, autograd per rank's positions",
            "inputs": inputs, "weight": rounded(weight), "microbatches": microbatches}
    (LOGPROBS / f"{name}.json").write_text(json.dumps(case, indent=1) + "\n")
    return case


def attention_visible(stream, window):
    """[S_pad, S_pad] bool: may query i see key j (docs/spec.md section 4b, restated)."""
    doc = torch.tensor(stream["document_ids"])
    pos = torch.tensor(stream["position_ids"])
    pad = torch.tensor(stream["padding"])
    seen = (doc[:, None] > 0) & (doc[:, None] == doc[None, :]) & (pos[None, :] <= pos[:, None]) \
        & ~pad[None, :]
    if window > 0:
        seen &= pos[:, None] - pos[None, :] < window
    return seen


def nullable(t):
    """Values rounded like `rounded`, -inf written as null (JSON has no infinity)."""
    if t.dim() == 1:
        return [None if v == -math.inf else float(f"{v:.9g}") for v in t.tolist()]
    return [nullable(x) for x in t]


def make_attention_case(name, fmt, cp, rows, S, seed, hq, hkv, d, docs=None, mask_zeros=(),
                        layout_kind="contiguous", window=0, softcap=0.0, sinks=False, scale=0.0):
    """cp_attention (docs/spec.md section 4b) in fp64 on the unsharded rows: every query over
    every key of its row under the mask, GQA by repeating key heads, the soft cap, sinks as an
    extra softmax column with no value. Each rank's expected values are those of its positions;
    its gradients autograd of the whole row's sum(out * upstream) (dq, dk, dv at its positions:
    a key's gradient summed over every rank's queries) and, for the sinks, of its own
    positions' share only."""
    g = torch.Generator().manual_seed(seed)
    inputs, s_pad, layout = layout_case(fmt, cp, rows, S, 5, g, docs=docs, mask_zeros=mask_zeros,
                                        layout=layout_kind)
    (row_ids, streams, _), = layout
    q = torch.randn(rows, s_pad, hq, d, generator=g)
    k = torch.randn(rows, s_pad, hkv, d, generator=g)
    v = torch.randn(rows, s_pad, hkv, d, generator=g)
    upstream = torch.randn(rows, s_pad, hq, d, generator=g)
    sink = torch.randn(hq, generator=g) if sinks else None
    qd, kd, vd = (t.double().requires_grad_(True) for t in (q, k, v))
    sd = sink.double().requires_grad_(True) if sinks else None
    used_scale = scale if scale > 0 else 1.0 / math.sqrt(d)
    kk = kd.repeat_interleave(hq // hkv, dim=2)
    vv = vd.repeat_interleave(hq // hkv, dim=2)
    scores = torch.einsum("bihd,bjhd->bhij", qd, kk) * used_scale
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    seen = torch.stack([attention_visible(st, window) for st in streams])  # [rows, S_pad, S_pad]
    scores = scores.masked_fill(~seen[:, None], -math.inf)
    if sinks:
        scores = torch.cat([scores, sd.view(1, hq, 1, 1).expand(rows, hq, s_pad, 1)], dim=3)
    lse = torch.logsumexp(scores, dim=3)  # [rows, hq, S_pad]
    p = torch.exp(scores - lse[..., None]).nan_to_num(0.0)
    if sinks:
        p = p[..., :s_pad]
    out = torch.einsum("bhij,bjhd->bihd", p, vv)
    total = (out * upstream.double()).sum()
    dq, dk, dv = torch.autograd.grad(total, (qd, kd, vd), retain_graph=True)
    slots = [x for x in inputs["seq_lens_padded"][0] if x != SENTINEL] if fmt == "thd" else None
    ranks = []
    for r, owned in enumerate(layout_positions(layout_kind, s_pad, cp, slots)):
        entry = {"rank": r, "positions": owned,
                 "out": rounded(out[:, owned].detach().float().flatten(2)),
                 "lse": nullable(lse[:, :, owned].detach().transpose(1, 2).float()),
                 "dq": rounded(dq[:, owned].float().flatten(2)),
                 "dk": rounded(dk[:, owned].float().flatten(2)),
                 "dv": rounded(dv[:, owned].float().flatten(2))}
        if sinks:
            mine = (out[:, owned] * upstream[:, owned].double()).sum()
            entry["dsinks"] = rounded(torch.autograd.grad(mine, sd, retain_graph=True)[0].float())
        ranks.append(entry)
    case = {"name": name, "format": fmt, "cp": cp, "num_chunks": 1, "pad_multiple": 1,
            "pad_token_id": 0, "vocab": 5, "softcap": softcap, "layout": layout_kind,
            "window": window, "scale": scale, "heads": [hq, hkv, d],
            "oracle": "torch fp64 dense masked softmax attention, autograd on the unsharded rows",
            "inputs": inputs,
            "microbatches": [{"rows": row_ids, "q": rounded(q.flatten(2)),
                              "k": rounded(k.flatten(2)), "v": rounded(v.flatten(2)),
                              "upstream": rounded(upstream.flatten(2)),
                              "sinks": rounded(sink) if sinks else [], "ranks": ranks}]}
    (ATTENTION / f"{name}.json").write_text(json.dumps(case, indent=1) + "\n")
    return case


def policy_objective(lp, ent, has, seq, x, o):
    """docs/spec.md section 5c's J and each position's w * l, written out in torch from the
    per-position log-probabilities lp and entropies ent [rows, S_pad] (fp64), the counted
    positions `has`, their sequence index `seq` and the inputs x [4, rows, S_pad]."""
    a, old, ref, sampler = x
    n_seq = torch.zeros(seq.numel(), dtype=torch.float64).index_add(
        0, seq[has], torch.ones(int(has.sum()), dtype=torch.float64))
    ratio = torch.exp(lp - old)
    if o["kind"] == "gspo":
        sums = torch.zeros_like(n_seq).index_add(0, seq[has], (lp - old)[has])
        ratio = torch.exp(sums / n_seq.clamp_min(1))[seq]
    low, high = 1 - o["eps_low"], 1 + o["eps_high"]
    if o["kind"] == "cispo":
        pg = -ratio.clamp(low, high).detach() * a * lp
    else:
        pg = torch.maximum(-a * ratio, -a * ratio.clamp(low, high))
        if o["dual_clip"] > 1:
            pg = torch.where(a < 0, torch.minimum(pg, -o["dual_clip"] * a), pg)
    if o["tis_cap"] > 0:
        pg = pg * torch.exp(old - sampler).clamp(max=o["tis_cap"])
    d = ref - lp
    kl = {"k1": -d, "k2": d * d / 2, "k3": torch.exp(d) - d - 1}[o["kl"]]
    loss = pg + o["kl_coef"] * kl - o["entropy_coef"] * ent
    groups = float((n_seq > 0).sum())
    w = {"token_mean": lambda: torch.full_like(lp, 1 / float(has.sum())),
         "seq_mean_token_mean": lambda: 1 / (groups * n_seq.clamp_min(1)[seq]),
         "seq_mean_token_sum": lambda: torch.full_like(lp, 1 / groups),
         "constant": lambda: torch.full_like(lp, 1 / o["divisor"])}[o["aggregation"]]()
    weighted = torch.where(has, w * loss, torch.zeros_like(lp))
    return weighted.sum(), weighted, torch.where(has, ratio, torch.zeros_like(lp))


def make_policy_case(name, fmt, cp, rows, S, vocab, hidden_size, seed, docs=None, ignore=(),
                     layout_kind="contiguous", **policy):
    """policy_loss (docs/spec.md section 5c) in fp64 on the unsharded batch: J from torch's
    log_softmax and autograd's d J / d lp and d J / d entropy at every position; rank r's loss
    is CP * the sum of w * l over its positions, its gradients CP * autograd of lp and entropy
    weighted by those derivatives at its positions (d hidden there, its d weight)."""
    o = dict(kind="ppo", eps_low=0.2, eps_high=0.2, dual_clip=0.0, kl="k3", kl_coef=0.0,
             tis_cap=0.0, entropy_coef=0.0, aggregation="token_mean", divisor=0.0)
    o.update(policy)
    g = torch.Generator().manual_seed(seed)
    inputs, s_pad, layout = layout_case(fmt, cp, rows, S, vocab, g, docs=docs, ignore=ignore,
                                        layout=layout_kind)
    (row_ids, streams, hf_labels), = layout
    hidden = torch.randn(rows, s_pad, hidden_size, generator=g)
    weight = torch.randn(vocab, hidden_size, generator=g) * (2.0 / math.sqrt(hidden_size))
    x = torch.randn(4, rows, s_pad, generator=g, dtype=torch.float64)
    x[1:] = x[1:] * 0.7 - math.log(vocab)
    x = x.float().double()  # the values the file holds
    h = hidden.double().requires_grad_(True)
    w = weight.double().requires_grad_(True)
    log_p = F.log_softmax(h @ w.T, dim=-1)
    targets = torch.full((rows, s_pad), IGNORE)
    targets[:, :S - 1] = hf_labels[:, 1:]
    has = targets != IGNORE
    lp = log_p.gather(-1, targets.clamp_min(0).unsqueeze(-1)).squeeze(-1)
    ent = -(log_p.exp() * log_p).sum(-1)
    ids = torch.tensor([st["document_ids"] for st in streams])
    seq = torch.arange(rows)[:, None] * (s_pad + 1) + ids
    lp_leaf, ent_leaf = lp.detach().requires_grad_(True), ent.detach().requires_grad_(True)
    J, weighted, ratio = policy_objective(lp_leaf, ent_leaf, has, seq, x, o)
    g_lp, g_ent = torch.autograd.grad(J, (lp_leaf, ent_leaf))
    slots = [v for v in inputs["seq_lens_padded"][0] if v != SENTINEL] if fmt == "thd" else None
    ranks = []
    for r, owned in enumerate(layout_positions(layout_kind, s_pad, cp, slots)):
        mask = torch.zeros(rows, s_pad, dtype=torch.float64)
        mask[:, owned] = cp
        dh, dw = torch.autograd.grad((lp, ent), (h, w), (g_lp * mask, g_ent * mask),
                                     retain_graph=True)
        ranks.append({"rank": r, "positions": owned,
                      "loss": float(weighted[:, owned].detach().sum()) * cp,
                      "logprobs": rounded((lp.detach() * has)[:, owned].float()),
                      "ratio": rounded(ratio[:, owned].detach().float()),
                      "dhidden": rounded(dh[:, owned].float()), "dweight": rounded(dw.float())})
    case = {"name": name, "format": fmt, "cp": cp, "num_chunks": 1, "pad_multiple": 1,
            "pad_token_id": 0, "vocab": vocab, "hidden_size": hidden_size, "softcap": 0.0,
            "layout": layout_kind, "policy": o,
            "oracle": "torch fp64 log_softmax, the section 5c objective, autograd",
            "inputs": inputs, "hidden": rounded(hidden), "weight": rounded(weight),
            "per_position": rounded(x.float()), "ranks": ranks}
    (POLICY / f"{name}.json").write_text(json.dumps(case, indent=1) + "\n")
    return case


def document_starts(docs, padding):
    """Where each token's attention document starts (docs/spec.md section 4a): a run of one
    document id; padding before the first real token of a run is its own document."""
    starts, current, seen_real = [], 0, False
    for t, (doc, pad) in enumerate(zip(docs, padding)):
        if t == 0 or doc != docs[t - 1] or (not pad and not seen_real and padding[t - 1]):
            current, seen_real = t, False
        seen_real = seen_real or not pad
        starts.append(current)
    return starts


def offsets_case(name, fmt, cp, rank, rows_streams, pad_len):
    """Varlen offsets of one rank, written out from the layout by hand-checkable loops."""
    L = pad_len // cp
    begin, end = rank * L, (rank + 1) * L
    starts = [document_starts(st["document_ids"], st["padding"]) for st in rows_streams]
    k_begin = min(s[begin] for s in starts)
    q, k = [0], [0]
    for s in starts:
        key, t = k_begin, begin
        while t < end:
            u = t + 1
            while u < end and s[u] == s[t]:
                u += 1
            if s[t] > key:
                q.append(q[-1])
                k.append(k[-1] + s[t] - key)
            q.append(q[-1] + u - t)
            k.append(k[-1] + u - s[t])
            key = t = u
    lengths_q = [b - a for a, b in zip(q, q[1:])]
    lengths_k = [b - a for a, b in zip(k, k[1:])]
    return {"rank": rank, "cu_seqlens_q": q, "cu_seqlens_k": k, "max_seqlen_q": max(lengths_q),
            "max_seqlen_k": max(lengths_k), "k_begin": k_begin, "k_end": end}


def make_offsets_case(name, fmt, cp, S, lens=None, slots=None, masks=None, rows=1):
    """A hand-checkable row (ids and labels do not matter to the offsets)."""
    s_pad = padded_length(S, cp, 1)
    streams, inputs = [], {"input_ids": [[1] * S for _ in range(rows)],
                           "labels": [[1] * S for _ in range(rows)]}
    for b in range(rows):
        if fmt == "thd":
            streams.append(thd_streams([1] * S, [1] * S, lens[b], slots[b], s_pad, 0))
        else:
            streams.append(bshd_streams([1] * S, [1] * S, list(range(S)),
                                        masks[b] if masks else None, s_pad, 0))
    if fmt == "thd":
        inputs["seq_lens"], inputs["seq_lens_padded"] = lens, slots
    elif masks:
        inputs["attention_mask"] = masks
    case = {"name": name, "format": fmt, "cp": cp, "inputs": inputs,
            "padded_len": s_pad, "ranks": [offsets_case(name, fmt, cp, r, streams, s_pad)
                                           for r in range(cp)]}
    (OFFSETS / f"{name}.json").write_text(json.dumps(case, indent=1) + "\n")


def main():
    OUT.mkdir(exist_ok=True)
    make_case("bshd_cp1_identity", "bshd", cp=1, rows=1, S=6, vocab=5, seed=1)
    make_case("bshd_cp2_boundary", "bshd", cp=2, rows=1, S=8, vocab=6, seed=2)
    make_case("bshd_cp3_padded", "bshd", cp=3, rows=2, S=7, vocab=5, seed=3, ignore=[(0, 2), (1, 5)])
    make_case("bshd_cp4_short_seq", "bshd", cp=4, rows=1, S=2, vocab=4, seed=4)
    make_case("bshd_cp2_chunks_mask", "bshd", cp=2, rows=4, S=5, vocab=7, seed=5, num_chunks=2,
              mask_zeros=[(0, 0), (3, 1)])
    make_case("bshd_cp4_pad_multiple", "bshd", cp=4, rows=1, S=9, vocab=5, seed=6, pad_multiple=2, pad_id=3)
    make_case("bshd_cp8_positions", "bshd", cp=8, rows=2, S=21, vocab=6, seed=7, positions_offset=10)
    make_case("bshd_cp2_all_ignored", "bshd", cp=2, rows=1, S=6, vocab=4, seed=8,
              ignore=[(0, t) for t in range(6)])
    make_case("thd_cp1_three_docs", "thd", cp=1, rows=1, S=10, vocab=6, seed=9,
              docs=[[(3, 1), (0, 1), (4, 0)]])
    make_case("thd_cp3_straddle", "thd", cp=3, rows=1, S=10, vocab=16, seed=10,
              docs=[[(3, 1), (0, 1), (4, 0)]])
    make_case("thd_cp4_five_docs", "thd", cp=4, rows=1, S=37, vocab=9, seed=11,
              docs=[[(7, 1), (0, 0), (11, 1), (3, 1), (9, 1)]])
    make_case("thd_cp2_two_rows", "thd", cp=2, rows=2, S=12, vocab=5, seed=12, num_chunks=2,
              docs=[[(5, 0), (6, 1)], [(1, 0), (0, 2), (8, 0)]])
    make_case("thd_cp8_one_long_doc", "thd", cp=8, rows=1, S=24, vocab=7, seed=13, docs=[[(24, 0)]])
    make_case("thd_cp5_pad_multiple", "thd", cp=5, rows=1, S=13, vocab=6, seed=14, pad_multiple=2,
              docs=[[(1, 0), (6, 2), (2, 0)]])
    make_case("thd_cp6_tail_only_rank", "thd", cp=6, rows=1, S=14, vocab=5, seed=15,
              docs=[[(4, 0), (3, 1)]])
    # Soft cap (Gemma 2 style, c * tanh(z / c)) with logits large enough that the cap bites.
    make_case("bshd_cp2_softcap", "bshd", cp=2, rows=2, S=7, vocab=9, seed=16, softcap=5.0,
              logit_scale=8.0, ignore=[(1, 3)])
    make_case("thd_cp3_softcap", "thd", cp=3, rows=1, S=11, vocab=6, seed=17, softcap=2.5,
              logit_scale=6.0, docs=[[(4, 1), (5, 0)]])
    # Positions that restart (documents packed into a BSHD row) and jump (left padding).
    make_case("bshd_cp3_restarting_positions", "bshd", cp=3, rows=2, S=8, vocab=5, seed=18,
              positions=[[5, 6, 7, 0, 1, 2, 3, 4], [0, 1, 4, 5, 6, 0, 9, 10]],
              mask_zeros=[(1, 0)])
    # Load-balanced layouts (docs/spec.md section 2b): head-tail on BSHD and THD; balanced
    # packed rows with a long document cut head-tail (extra tokens) and short ones placed
    # greedily, one cut where no rank has room.
    make_case("bshd_cp2_head_tail", "bshd", cp=2, rows=2, S=7, vocab=5, seed=19,
              layout_kind="head_tail", ignore=[(1, 4)])
    make_case("thd_cp3_head_tail", "thd", cp=3, rows=1, S=10, vocab=6, seed=20,
              layout_kind="head_tail", docs=[[(3, 1), (0, 1), (4, 0)]])
    make_case("thd_cp2_balanced_long_doc", "thd", cp=2, rows=1, S=301, vocab=4, seed=21,
              layout_kind="balanced", docs=[[(9, 1), (261, 2), (0, 1), (17, 0), (5, 1)]])
    make_case("thd_cp3_balanced_short_docs", "thd", cp=3, rows=1, S=31, vocab=5, seed=22,
              layout_kind="balanced", docs=[[(7, 0), (2, 1), (11, 0), (5, 0), (4, 0)]])
    # Spec 2b's candidates: two equal documents stay whole, one per rank (no keys move);
    # documents cut over 2 of 4 ranks and over all 4, and whole ones, in one row.
    make_case("thd_cp2_balanced_whole_docs", "thd", cp=2, rows=1, S=600, vocab=4, seed=23,
              layout_kind="balanced", docs=[[(300, 0), (300, 0)]])
    make_case("thd_cp4_balanced_groups", "thd", cp=4, rows=1, S=1500, vocab=5, seed=24,
              layout_kind="balanced", docs=[[(700, 0), (300, 0), (200, 0), (150, 0), (90, 0),
                                             (60, 0)]])
    # Varlen attention offsets (hand-checkable; docs/spec.md section 4a).
    OFFSETS.mkdir(exist_ok=True)
    make_offsets_case("thd_cp3_three_docs", "thd", cp=3, S=10, lens=[[3, 0, 4]], slots=[[4, 1, 4]])
    make_offsets_case("thd_cp4_one_long_doc", "thd", cp=4, S=13, lens=[[11]], slots=[[12]])
    make_offsets_case("thd_cp2_empty_docs_and_tail", "thd", cp=2, S=9,
                      lens=[[0, 2, 0, 3, SENTINEL]], slots=[[1, 2, 0, 4, SENTINEL]])
    make_offsets_case("bshd_cp2_left_right_padding", "bshd", cp=2, S=7, rows=2,
                      masks=[[0, 0, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1, 1]])
    # The LM head fused into the loss (docs/spec.md section 5a).
    LINEAR.mkdir(exist_ok=True)
    make_linear_case("linear_bshd_cp2", "bshd", cp=2, rows=2, S=7, vocab=11, hidden_size=6, seed=30,
                     ignore=[(1, 2)])
    make_linear_case("linear_thd_cp3_softcap", "thd", cp=3, rows=1, S=11, vocab=9, hidden_size=5,
                     seed=31, docs=[[(4, 1), (5, 1)]], softcap=2.0, head_scale=6.0)
    make_linear_case("linear_bshd_cp4_short", "bshd", cp=4, rows=1, S=3, vocab=7, hidden_size=4,
                     seed=32)
    # Per-token log-probabilities and entropies through the head (docs/spec.md section 5b).
    LOGPROBS.mkdir(exist_ok=True)
    make_logprobs_case("logprobs_bshd_cp2", "bshd", cp=2, rows=2, S=7, vocab=11, hidden_size=6,
                       seed=40, ignore=[(1, 2)])
    make_logprobs_case("logprobs_thd_cp3_softcap_temperature", "thd", cp=3, rows=1, S=11,
                       vocab=9, hidden_size=5, seed=41, docs=[[(4, 1), (5, 1)]], softcap=2.0,
                       temperature=0.7, head_scale=6.0)
    # cpkit's own CP attention (docs/spec.md section 4b): every layout, BSHD and THD, GQA,
    # windows, soft cap and sinks; documents cut across ranks, a rank holding two pieces of
    # one (head_tail, balanced), queries that see nothing (the row tail, left padding).
    ATTENTION.mkdir(exist_ok=True)
    make_attention_case("attention_bshd_cp2_left_padding", "bshd", cp=2, rows=2, S=9, seed=50,
                        hq=2, hkv=1, d=4, mask_zeros=[(1, 0), (1, 1)])
    make_attention_case("attention_thd_cp3_window_sinks", "thd", cp=3, rows=1, S=20, seed=51,
                        hq=4, hkv=2, d=3, docs=[[(6, 1), (0, 1), (9, 0)]], window=4, sinks=True)
    make_attention_case("attention_thd_cp2_head_tail_softcap", "thd", cp=2, rows=1, S=15, seed=52,
                        hq=2, hkv=2, d=5, docs=[[(11, 0), (3, 1)]], layout_kind="head_tail",
                        softcap=1.5, scale=0.6)
    make_attention_case("attention_thd_cp2_balanced_long_doc", "thd", cp=2, rows=1, S=301,
                        seed=53, hq=2, hkv=1, d=2,
                        docs=[[(9, 1), (261, 2), (0, 1), (17, 0), (5, 1)]],
                        layout_kind="balanced", window=40, sinks=True)
    make_attention_case("attention_bshd_cp4_head_tail_gqa", "bshd", cp=4, rows=1, S=13, seed=54,
                        hq=4, hkv=1, d=4, layout_kind="head_tail")
    # The RL policy loss through the head (docs/spec.md section 5c): sequences cut across
    # ranks, every kind and aggregation, DAPO's asymmetric clip, the dual clip, KL, TIS.
    POLICY.mkdir(exist_ok=True)
    make_policy_case("policy_bshd_cp2_ppo_dual_clip", "bshd", cp=2, rows=2, S=9, vocab=11,
                     hidden_size=6, seed=60, ignore=[(1, 3)], dual_clip=3.0, kl="k3",
                     kl_coef=0.05, eps_high=0.28)
    make_policy_case("policy_thd_cp3_gspo_seq_mean", "thd", cp=3, rows=1, S=20, vocab=9,
                     hidden_size=5, seed=61, docs=[[(8, 1), (0, 1), (9, 1)]], kind="gspo",
                     aggregation="seq_mean_token_mean", entropy_coef=0.01)
    make_policy_case("policy_thd_cp2_balanced_cispo_tis", "thd", cp=2, rows=1, S=301, vocab=7,
                     hidden_size=4, seed=62, docs=[[(9, 1), (261, 2), (0, 1), (17, 0), (5, 1)]],
                     layout_kind="balanced", kind="cispo", tis_cap=2.0, kl="k2", kl_coef=0.1,
                     aggregation="seq_mean_token_sum")
    make_policy_case("policy_thd_cp2_head_tail_constant", "thd", cp=2, rows=1, S=15, vocab=8,
                     hidden_size=4, seed=63, docs=[[(11, 0), (3, 1)]], layout_kind="head_tail",
                     aggregation="constant", divisor=20.0, kl="k1", kl_coef=0.1)
    print(f"wrote {len(list(OUT.glob('*.json')))} cases to {OUT}")


if __name__ == "__main__":
    main()
