"""What Hugging Face collators produce -> cpkit's batch -> this rank's model inputs.

Documents come from ``seq_lens`` (cpkit's own) or from ``position_ids`` restarting at 0
(``DataCollatorWithFlattening``); anything else is a BSHD batch of independent rows."""

from __future__ import annotations

import functools

import torch

from .._api import prepare_cp_inputs, prepare_packed_cp_inputs
from .._errors import raise_error
from .._mesh import Mesh, group_name

# DataCollatorWithFlattening's flash-attention extras: offsets of the whole row, wrong for a
# shard, so they are dropped (the shard carries its own).
_COLLATOR_EXTRAS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "seq_idx")
_FIELDS = ("input_ids", "inputs_embeds", "labels", "attention_mask", "position_ids",
           "seq_lens", "seq_lens_padded")
# An RL batch's per-token values, [B, S] like labels (the value of the token at t); the shard
# holds them prediction-aligned for cpkit.policy_loss (docs/spec.md section 5c).
POLICY_FIELDS = ("advantages", "old_logprobs", "ref_logprobs", "sampler_logprobs")


def _restarts(position_ids: torch.Tensor) -> bool:
    """Whether a row's positions restart at 0 after its first token (position-id packing)."""
    return bool((position_ids[:, 1:] == 0).any())


def _lengths_from_positions(position_ids: torch.Tensor) -> torch.Tensor:
    """[1, T] positions, 0 at each document's first token and +1 after -> [1, D] lengths."""
    p = position_ids[0]
    steps_up = p[1:] == p[:-1] + 1
    restarts = p[1:] == 0
    broken = torch.nonzero(~(steps_up | restarts)).flatten()
    if int(p[0]) != 0 or len(broken):
        t = 0 if int(p[0]) != 0 else int(broken[0]) + 1
        before = "" if t == 0 else f" after {int(p[t - 1])}"
        raise_error("position_ids", f"token {t} has position {int(p[t])}{before}: position-id "
                    "packing starts every document at 0 and counts up by 1")
    starts = torch.cat([torch.zeros(1, dtype=torch.long), torch.nonzero(restarts).flatten() + 1,
                        torch.tensor([p.numel()])])
    return (starts[1:] - starts[:-1]).view(1, -1)


def cp_batch(batch: dict, packed: bool | None) -> dict:
    """A collator's dict -> cpkit's batch (``qkv_format`` "thd" for packed documents).
    ``packed``: None decides from the batch; True requires documents; False treats rows as
    independent sequences (position_ids pass through as the model's positions)."""
    unknown = sorted(set(batch) - set(_FIELDS) - set(_COLLATOR_EXTRAS) - set(POLICY_FIELDS))
    if unknown:
        raise_error(unknown[0], f"is not a field shard_batch takes ({', '.join(_FIELDS)} and "
                    f"DataCollatorWithFlattening's {', '.join(_COLLATOR_EXTRAS)})")
    fields = {k: v for k, v in batch.items() if k in _FIELDS and v is not None}
    for key in POLICY_FIELDS:
        if batch.get(key) is not None and batch[key].shape != batch["labels"].shape:
            raise_error(key, f"must be [B, S] like labels {list(batch['labels'].shape)}, got "
                        f"{list(batch[key].shape)}")
    for key, value in fields.items():
        if not isinstance(value, torch.Tensor):
            raise_error(key, f"must be a tensor, got {type(value).__name__}")
    if "labels" not in fields:
        raise_error("labels", "is missing: training through cpkit needs the collator's labels")
    positions = fields.get("position_ids")
    by_positions = positions is not None and positions.dim() == 2 and _restarts(positions)
    documents = "seq_lens" in fields or by_positions
    if packed is None:
        packed = documents
    if packed and not documents:
        raise_error("batch", "packed=True needs documents: seq_lens, or position_ids that "
                    "restart at 0 for every document (DataCollatorWithFlattening); got neither")
    if not packed:
        return {**fields, "qkv_format": "bshd"}
    if "attention_mask" in fields:
        raise_error("attention_mask", "packed documents take no attention_mask (their "
                    "boundaries come from seq_lens or position_ids)")
    if "seq_lens" not in fields:
        rows = positions.shape[0]
        if rows != 1:
            raise_error("position_ids", f"position-id packing needs one packed row, got {rows} "
                        "rows (DataCollatorWithFlattening gives [1, T])")
        fields["seq_lens"] = _lengths_from_positions(positions)
    fields.setdefault("seq_lens_padded", fields["seq_lens"])  # no slot padding
    fields.pop("position_ids", None)  # cpkit restarts positions at each document itself
    return {**fields, "qkv_format": "thd"}


def _policy_values(batch: dict, positions: torch.Tensor, labels: torch.Tensor) -> dict:
    """The batch's per-token RL values at this rank's positions, prediction-aligned: position
    j holds the value of the token at j + 1, the one it predicts. The shift happens on the
    whole batch, before the cut, so no value crosses a shard boundary wrongly."""
    out = {}
    for key in POLICY_FIELDS:
        value = batch.get(key)
        if value is None:
            continue
        rows, length = value.shape
        shifted = torch.zeros(rows, max(length, int(positions.max()) + 1), dtype=torch.float32)
        shifted[:, :length - 1] = value[:, 1:].float()
        out[key] = shifted[:, positions].contiguous().to(labels.device)
    return out


def shard_batch(batch: dict, mesh: Mesh, *, layout: str = "contiguous",
                packed: bool | None = None, pad_token_id: int = 0,
                balance_slack: float | None = None) -> dict:
    """This rank's keyword arguments for a model made context-parallel by ``apply``:
    ``model(**shard_batch(batch, mesh)).loss``.

    ``batch``: what an HF collator returns (``input_ids``, ``labels``, optional
    ``attention_mask`` or ``position_ids``), packed documents by ``seq_lens`` or by
    ``position_ids`` restarting at 0 (``DataCollatorWithFlattening``). ``layout``:
    "contiguous", "head_tail" or "balanced" (packed documents; docs/spec.md 2b;
    ``balance_slack`` as for ``prepare_packed_cp_inputs``). An RL batch
    adds ``advantages`` and ``old_logprobs`` (optionally ``ref_logprobs``,
    ``sampler_logprobs``), ``[B, S]`` like ``labels``, for ``model(**shard, policy={...})``."""
    converted = cp_batch(batch, packed)
    extra = {"balance_slack": balance_slack} if converted["qkv_format"] == "thd" else {}
    prepare = prepare_packed_cp_inputs if converted["qkv_format"] == "thd" else prepare_cp_inputs
    sharder = prepare(converted, 1, mesh=mesh, pad_token_id=pad_token_id, layout=layout,
                      **extra)
    local = sharder.local(0)
    primary = "inputs_embeds" if "inputs_embeds" in local else "input_ids"
    out = {primary: local.pop(primary), "position_ids": local.pop("position_ids"),
           "labels": local.pop("labels")}
    local.update(group=group_name(mesh), rank=sharder.rank, cp=sharder.cp_size,
                 packed=converted["qkv_format"] == "thd",
                 attention_plan=functools.partial(sharder.attention_plan, 0),
                 policy=_policy_values(batch, sharder.positions(0), out["labels"]))
    out["cpkit_shard"] = local
    return out
