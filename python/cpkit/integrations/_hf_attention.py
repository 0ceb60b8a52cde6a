"""The attention function cpkit registers with transformers' AttentionInterface. Backend
"cpkit": cpkit.cp_attention (docs/spec.md section 4b), which moves only the keys each rank's
queries need, with sliding windows, attention sinks and soft-capped logits, on CPU and CUDA.
Backend "varlen" (only when asked for by name): the shard's queries against the keys and
values of the whole sequence (cpkit.gather_tokens along the token axis of HF's [B, H, S, D])
through torch's varlen kernel and the shard's offsets."""

from __future__ import annotations

import torch

from .._api import cp_attention as _cp_attention
from .._api import gather_tokens
from .._errors import raise_error

try:  # FlashAttention / cuDNN varlen kernel where torch has one (CUDA, half precision)
    from torch.nn.attention.varlen import varlen_attn
except ImportError:  # pragma: no cover - torch without the varlen API
    varlen_attn = None

NAME = "cpkit"
BACKENDS = ("auto", "cpkit", "varlen")


def attention_context(shard: dict, mesh, backend: str) -> dict:
    """Per-step state every layer shares: cp_attention's plans (one per sliding window,
    planned on first use in this step) or, for "varlen", the shard's offsets."""
    context = {"mesh": mesh, "backend": backend, "shard": shard}
    if backend == "cpkit":
        context["plans"] = {}
    return context


def cp_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                 value: torch.Tensor, attention_mask, scaling: float | None = None,
                 dropout: float = 0.0, sliding_window: int | None = None, **kwargs):
    """HF's attention-function signature: ``query [B, Hq, L, D]``, ``key``/``value``
    ``[B, Hkv, L, D]`` of this rank's shard -> ``([B, L, Hq, D], None)``. ``attention_mask``
    is None (transformers builds no mask for an implementation without a mask function); the
    mask comes from the shard."""
    context = kwargs.get("cpkit_attention")
    if context is None:
        raise_error("cpkit_attention", "is missing: this model's attention was made "
                    "context-parallel by cpkit.integrations.transformers.apply; call the "
                    "model with model(**shard_batch(batch, mesh))")
    if dropout:
        raise_error("model", f"trains with attention dropout {dropout}, which cpkit's "
                    "attention backends do not apply")
    if context["backend"] == "cpkit":
        return _cpkit(query, key, value, context, scaling, sliding_window, kwargs), None
    for name in ("s_aux", "softcap"):  # attention sinks, attention-logit soft-capping
        if kwargs.get(name) is not None:
            raise_error("model", f"passes '{name}' to its attention, which the "
                        f"\"{context['backend']}\" backend does not implement (\"cpkit\" does)")
    mesh = context["mesh"]
    keys = gather_tokens(key, mesh, dim=2)  # [B, Hkv, CP * L, D], rank order
    values = gather_tokens(value, mesh, dim=2)
    return _varlen(query, keys, values, context["shard"], scaling, sliding_window), None


def _cpkit(query, key, value, context, scaling, sliding_window, kwargs):
    """cpkit.cp_attention on HF's [B, H, L, D] views: only the needed keys move; sinks
    (gpt-oss's ``s_aux``) and soft-capped logits (Gemma 2) inside the op."""
    window = int(sliding_window or 0)
    plans = context["plans"]
    if window not in plans:
        plans[window] = context["shard"]["attention_plan"](window)
    sinks = kwargs.get("s_aux")
    out = _cp_attention(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                        plans[window], context["mesh"], scale=scaling or 0.0,
                        softcap=float(kwargs.get("softcap") or 0.0),
                        sinks=None if sinks is None else sinks.float())
    return out.out  # [B, L, Hq, D]


def _varlen(query, keys, values, shard, scaling, sliding_window) -> torch.Tensor:
    """The same attention from the shard's varlen offsets (one packed row): queries as they
    are, the gathered keys ``[k_begin, k_end)`` (contiguous) or ``k_index`` (other layouts),
    causal with bottom-right alignment. Padding queries' outputs are unspecified and reach
    only ignored labels."""
    used = shard.get("k_index")
    if used is None:
        used = slice(shard["k_begin"], shard["k_end"])
    tokens = lambda t: t[0].transpose(0, 1)  # noqa: E731  [1, H, N, D] -> [N, H, D]
    left = -1 if sliding_window is None else sliding_window - 1
    out = varlen_attn(tokens(query), tokens(keys)[used], tokens(values)[used],
                      shard["cu_seqlens_q"], shard["cu_seqlens_k"], shard["max_seqlen_q"],
                      shard["max_seqlen_k"], scale=scaling, window_size=(left, 0))
    return out.unsqueeze(0)  # [1, L, Hq, D]
