"""Hugging Face transformers causal LMs, context-parallel in a few lines (docs/python.md):

    from cpkit.integrations import transformers as cp_hf

    cp_hf.apply(model, mesh["cp"])                  # before or after fully_shard
    shard = cp_hf.shard_batch(batch, mesh["cp"], layout="balanced")   # a collator's dict
    model(**shard).loss.backward()

``apply`` registers cpkit's attention with transformers' AttentionInterface and gives the
model a forward that takes a shard: the base model runs on this rank's tokens (keys and
values gathered across the CP group per layer, the mask exact by document and position) and
the loss is ``shifted_cp_linear_loss`` (the LM head fused in: no ``[B, L, V]`` logits) or,
with ``loss="logits"``, the head then ``shifted_cp_loss``. Either loss is scaled so that the
gradient average over the CP ranks (FSDP over the data x context ranks) is the
single-device gradient. transformers is an optional dependency: ``pip install
cpkit[transformers]``.
"""

from __future__ import annotations

import types

import torch

from .._api import policy_loss, shifted_cp_linear_loss, shifted_cp_loss
from .._errors import raise_error, translate
from .._mesh import Mesh, group_name
from ._hf_attention import BACKENDS, NAME, attention_context, cp_attention
from ._hf_batch import shard_batch

try:
    from transformers import AttentionInterface, PreTrainedModel
    from transformers.modeling_outputs import CausalLMOutputWithPast
except ImportError as error:  # pragma: no cover - exercised only without transformers
    raise ImportError("cpkit.integrations.transformers needs transformers: pip install "
                      "'cpkit[transformers]'") from error

__all__ = ["apply", "shard_batch"]
LOSSES = ("fused", "logits")


def _check_model(model) -> None:
    """What the integration relies on, checked once, naming what is missing."""
    name = type(model).__name__
    if not isinstance(model, PreTrainedModel):
        raise_error("model", f"must be a transformers PreTrainedModel, got {name}")
    if not type(model)._supports_attention_backend:
        raise_error("model", f"{name} does not route its attention through transformers' "
                    "AttentionInterface, so cpkit cannot replace it")
    head = model.get_output_embeddings()
    if model.base_model is model or not isinstance(head, torch.nn.Linear):
        raise_error("model", f"{name} is not a causal LM with a linear head "
                    "(AutoModelForCausalLM)")
    if head.bias is not None or getattr(model.config, "logit_scale", None) is not None:
        raise_error("model", f"{name}'s head has a bias or a logit scale, which the CP losses "
                    "do not apply")


@translate
def apply(model, mesh: Mesh, *, loss: str = "fused", attention: str = "auto",
          chunk_rows: int = 0):
    """Makes ``model`` (an HF causal LM of the Llama / Qwen2 / Mistral family) context-parallel
    over ``mesh`` (its CP dimension) in place and returns it. Call it with
    ``model(**shard_batch(batch, mesh))``: the output's ``loss`` is this rank's share
    (``local_sum * CP / N_global``), its ``logits`` None under the fused loss.

    ``loss``: "fused" (``shifted_cp_linear_loss``, ``chunk_rows`` as there) or "logits".
    ``attention``: "cpkit" (cpkit.cp_attention: only the keys each rank needs move;
    sliding windows, sinks and soft-capped attention logits; CPU and CUDA, float32, bfloat16
    and float16, torch's flash kernels where they apply; what "auto" picks) or "varlen" (all
    keys gathered, torch's varlen kernel from the shard's offsets: CUDA, half precision,
    packed documents). Soft-capped final logits
    (``final_logit_softcapping``) pass to the loss; sliding-window layers are masked exactly.
    """
    _check_model(model)
    if loss not in LOSSES:
        raise_error("loss", f"must be one of {', '.join(LOSSES)}, got \"{loss}\"")
    if attention not in BACKENDS:
        raise_error("attention", f"must be one of {', '.join(BACKENDS)}, got \"{attention}\"")
    AttentionInterface.register(NAME, cp_attention)
    model.set_attn_implementation(NAME)
    model.cpkit_settings = types.SimpleNamespace(mesh=mesh, loss=loss, attention=attention,
                                                 chunk_rows=int(chunk_rows))
    model.forward = types.MethodType(_forward, model)
    return model


def _backend(settings, shard: dict) -> str:
    if settings.attention != "auto":
        if settings.attention == "varlen" and not shard["packed"]:
            raise_error("attention", "\"varlen\" needs packed documents (seq_lens or "
                        "position-id packing)")
        return settings.attention
    return "cpkit"


def _head_weight(head) -> torch.Tensor:
    """The head's weight as the fused losses read it (whole, not an FSDP2 shard)."""
    if hasattr(head.weight, "full_tensor"):  # still an FSDP2 shard (a DTensor)
        raise_error("model", "lm_head.weight is a DTensor during the forward: fully_shard the "
                    "model's root (it unshards the head for the fused loss), not lm_head alone")
    return head.weight


@translate
def _forward(self, input_ids=None, position_ids=None, labels=None, cpkit_shard=None,
             inputs_embeds=None, attention_mask=None, policy=None, **kwargs):
    """The forward ``apply`` installs: this rank's shard through the base model, then the
    CP loss with the shard's layout. ``policy`` (a dict of ``cpkit.policy_loss`` options:
    ``kind``, ``eps_low``, ``aggregation``, ``kl_coef``, ``dp_mesh``, ...) makes the loss the
    RL policy loss over the batch's ``advantages`` and ``old_logprobs`` (shard_batch)."""
    settings = self.cpkit_settings
    if cpkit_shard is None:
        raise_error("cpkit_shard", "is missing: call a model made context-parallel by "
                    "cpkit.integrations.transformers.apply as model(**shard_batch(batch, mesh))")
    if attention_mask is not None:  # transformers would drop it silently
        raise_error("attention_mask", "goes to shard_batch with the rest of the batch, not to "
                    "the model: the shard's mask is exact across ranks")
    if cpkit_shard["group"] != group_name(settings.mesh):
        raise_error("cpkit_shard", "was cut for another CP group than the model's mesh")
    backend = _backend(settings, cpkit_shard)
    context = attention_context(cpkit_shard, settings.mesh, backend)
    hidden = self.base_model(input_ids=input_ids, inputs_embeds=inputs_embeds,
                             position_ids=position_ids, use_cache=False,
                             cpkit_attention=context, **kwargs).last_hidden_state
    head = self.get_output_embeddings()
    softcap = float(getattr(self.config, "final_logit_softcapping", None) or 0.0)
    valid, layout = cpkit_shard["valid"], cpkit_shard["layout"]
    if policy is not None:
        values = cpkit_shard["policy"]
        for key in ("advantages", "old_logprobs"):
            if key not in values:
                raise_error(key, "is missing: a policy loss needs the batch's advantages and "
                            "old_logprobs ([B, S] like labels) passed to shard_batch")
        out = policy_loss(hidden, _head_weight(head), labels, valid, values["advantages"],
                          values["old_logprobs"], settings.mesh,
                          ref_logprobs=values.get("ref_logprobs"),
                          sampler_logprobs=values.get("sampler_logprobs"),
                          sequence_ids=cpkit_shard["document_ids"], softcap=softcap,
                          chunk_rows=settings.chunk_rows, layout=layout, **policy)
        return CausalLMOutputWithPast(loss=out.loss, logits=None)
    if labels is None or settings.loss == "logits":
        raw = head(hidden)
        loss = None
        if labels is not None:  # the loss applies the soft cap itself
            loss = shifted_cp_loss(raw.float(), labels, valid, settings.mesh, softcap, layout)
        logits = softcap * torch.tanh(raw / softcap) if softcap else raw
        return CausalLMOutputWithPast(loss=loss, logits=logits)
    loss = shifted_cp_linear_loss(hidden, _head_weight(head), labels, valid, settings.mesh,
                                  softcap, settings.chunk_rows, layout)
    return CausalLMOutputWithPast(loss=loss, logits=None)
