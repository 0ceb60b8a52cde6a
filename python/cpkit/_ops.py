"""Autograd formulas and fake (meta) kernels of torch.ops.cpkit.*, registered once on import.
The forward and backward computations are the C++ library's ops; this file only wires them
to PyTorch's autograd and gives torch.compile the output shapes."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from ._errors import translate

_LIB = "cpkit::"


def _group_size(group_name: str) -> int:
    return _group_size_and_rank(group_name)[0]


def _group_size_and_rank(group_name: str) -> tuple[int, int]:
    if not group_name:
        return 1, 0
    group = dist.distributed_c10d._resolve_process_group(group_name)
    return group.size(), group.rank()


def _local_length(seq_len: int, cp_size: int, rank: int, pad_multiple: int,
                  layout: str = "contiguous") -> int:
    return torch.ops.cpkit.shard_layout(seq_len, cp_size, rank, pad_multiple, layout)[2]


# ---- gather_tokens: all-gather forward, reduce-scatter SUM backward (and its adjoint) ----


def _resized(t: torch.Tensor, dim: int, size) -> torch.Tensor:  # type: ignore[no-untyped-def]
    sizes = list(t.shape)
    sizes[dim] = size  # a wrong dim raises IndexError here and CPError in the real op
    return t.new_empty(sizes)


@torch.library.register_fake(_LIB + "gather_tokens")
def _gather_fake(value: torch.Tensor, group_name: str, dim: int = 0) -> torch.Tensor:
    return _resized(value, dim, value.shape[dim] * _group_size(group_name))


@torch.library.register_fake(_LIB + "reduce_scatter_tokens")
def _reduce_scatter_fake(grad: torch.Tensor, group_name: str, dim: int = 0) -> torch.Tensor:
    return _resized(grad, dim, grad.shape[dim] // _group_size(group_name))


def _setup_group(ctx: Any, inputs: tuple, output: Any) -> None:
    ctx.group_name, ctx.dim = inputs[1], inputs[2] if len(inputs) > 2 else 0


def _gather_backward(ctx: Any, grad: torch.Tensor) -> tuple:
    return torch.ops.cpkit.reduce_scatter_tokens(grad, ctx.group_name, ctx.dim), None, None


def _reduce_scatter_backward(ctx: Any, grad: torch.Tensor) -> tuple:
    return torch.ops.cpkit.gather_tokens(grad, ctx.group_name, ctx.dim), None, None


torch.library.register_autograd(
    _LIB + "gather_tokens", _gather_backward, setup_context=_setup_group
)
torch.library.register_autograd(
    _LIB + "reduce_scatter_tokens", _reduce_scatter_backward, setup_context=_setup_group
)

# ---- shifted_cp_loss: the fused kernel returns the loss and its gradient together ----


@torch.library.register_fake(_LIB + "shifted_cp_loss")
def _loss_fake(logits, labels, valid, group_name, softcap, layout=None):  # type: ignore[no-untyped-def]
    return logits.new_empty(()), torch.empty_like(logits)


def _loss_setup(ctx: Any, inputs: tuple, output: tuple) -> None:
    ctx.save_for_backward(output[1])
    ctx.mark_non_differentiable(output[1])
    # The gradient output has no gradient: never materialise a zero [B, L, V] for it.
    ctx.set_materialize_grads(False)


@torch.library.register_fake(_LIB + "scale_loss_gradient_")
def _scale_fake(grad_logits, upstream):  # type: ignore[no-untyped-def]
    return None


def _loss_backward(ctx: Any, grad_loss: torch.Tensor, _grad_of_grad: Any) -> tuple:
    (grad,) = ctx.saved_tensors
    if grad_loss is None:  # the loss was not used
        return None, None, None, None, None, None
    # The saved gradient is scaled in place (no second [B, L, V] buffer; nothing at all for
    # loss.backward()'s upstream of 1, read on the device for CUDA), so it serves one backward.
    translate(torch.ops.cpkit.check_backward_once)(getattr(ctx, "backward_done", False))
    ctx.backward_done = True
    if type(grad) is not torch.Tensor or type(grad_loss) is not torch.Tensor:
        # Traced (fake or functional tensors): compiled graphs may not mutate a tensor saved
        # by the forward, so the trace takes the multiply and the compiler fuses it.
        return grad * grad_loss, None, None, None, None, None
    torch.ops.cpkit.scale_loss_gradient_(grad, grad_loss)
    return grad, None, None, None, None, None


torch.library.register_autograd(
    _LIB + "shifted_cp_loss", _loss_backward, setup_context=_loss_setup
)

# ---- shifted_cp_linear_loss: the LM head fused into the loss, gradients from the forward ----


@torch.library.register_fake(_LIB + "shifted_cp_linear_loss")
def _linear_loss_fake(hidden, weight, labels, valid, group_name, softcap, chunk_rows,
                      grad_hidden, grad_weight, layout=None,
                      logits_precision="input"):  # type: ignore[no-untyped-def]
    dh = torch.empty_like(hidden) if grad_hidden else hidden.new_empty((0,))
    dw = torch.empty_like(weight) if grad_weight else weight.new_empty((0,))
    return hidden.new_empty((), dtype=torch.float32), dh, dw


def _linear_loss_setup(ctx: Any, inputs: tuple, output: tuple) -> None:
    ctx.save_for_backward(output[1], output[2])
    ctx.wanted = (inputs[7], inputs[8])
    ctx.mark_non_differentiable(output[1], output[2])
    ctx.set_materialize_grads(False)


def _times_upstream(grad: torch.Tensor, upstream: torch.Tensor) -> torch.Tensor:
    # d hidden and d weight are small next to the logits: an out-of-place multiply (on the
    # device for a CUDA upstream), skipped in eager mode where the library's rule says so.
    if type(upstream) is torch.Tensor and torch.ops.cpkit.leaves_gradient_as_is(upstream):
        return grad
    return grad * upstream


def _head_gradients(ctx: Any, grad_loss: Any, inputs: int) -> tuple:
    """A fused head op's backward: the forward's d hidden and d weight times the loss's
    upstream, then None for its other `inputs - 2` inputs."""
    dh, dw = ctx.saved_tensors
    none = (None,) * (inputs - 2)
    if grad_loss is None:
        return (None, None) + none
    want_hidden, want_weight = ctx.wanted
    return (
        _times_upstream(dh, grad_loss) if want_hidden else None,
        _times_upstream(dw, grad_loss) if want_weight else None,
    ) + none


def _linear_loss_backward(ctx: Any, grad_loss: torch.Tensor, _dh: Any, _dw: Any) -> tuple:
    return _head_gradients(ctx, grad_loss, 11)


torch.library.register_autograd(
    _LIB + "shifted_cp_linear_loss", _linear_loss_backward, setup_context=_linear_loss_setup
)

# ---- token_logprobs: per-token values; the backward recomputes the head's logits ----


@torch.library.register_fake(_LIB + "token_logprobs")
def _logprobs_fake(hidden, weight, labels, valid, group_name, softcap, temperature, entropy,
                   logits_precision, chunk_rows, layout=None):  # type: ignore[no-untyped-def]
    B, L = hidden.shape[0], hidden.shape[1]
    values = hidden.new_empty((B, L), dtype=torch.float32)
    ent = hidden.new_empty((B, L), dtype=torch.float32) if entropy else hidden.new_empty((0,))
    return (values, ent, hidden.new_empty((B, L), dtype=torch.bool),
            hidden.new_empty((B, L), dtype=torch.int64),
            hidden.new_empty((B * L, 3), dtype=torch.float32))


@torch.library.register_fake(_LIB + "token_logprobs_backward")
def _logprobs_backward_fake(hidden, weight, targets, stats, grad_logprobs, grad_entropy, softcap,
                            temperature, logits_precision, chunk_rows, grad_hidden,
                            grad_weight):  # type: ignore[no-untyped-def]
    return (torch.empty_like(hidden) if grad_hidden else hidden.new_empty((0,)),
            torch.empty_like(weight) if grad_weight else weight.new_empty((0,)))


def _logprobs_setup(ctx: Any, inputs: tuple, output: tuple) -> None:
    hidden, weight = inputs[0], inputs[1]
    ctx.save_for_backward(hidden, weight, output[3], output[4])
    ctx.options = (inputs[5], inputs[6], inputs[8], inputs[9])  # softcap, t, precision, chunk
    ctx.entropy = inputs[7]
    ctx.mark_non_differentiable(output[2], output[3], output[4])
    ctx.set_materialize_grads(False)


def _logprobs_backward(ctx: Any, grad_lp: Any, grad_ent: Any, *_rest: Any) -> tuple:
    none = (None,) * 9
    if not ctx.entropy:
        grad_ent = None
    if grad_lp is None and grad_ent is None:
        return (None, None) + none
    hidden, weight, targets, stats = ctx.saved_tensors
    softcap, temperature, precision, chunk_rows = ctx.options
    want_hidden, want_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    dh, dw = torch.ops.cpkit.token_logprobs_backward(
        hidden, weight, targets, stats, grad_lp, grad_ent, softcap, temperature, precision,
        chunk_rows, want_hidden, want_weight)
    return (dh if want_hidden else None, dw if want_weight else None) + none


torch.library.register_autograd(
    _LIB + "token_logprobs", _logprobs_backward, setup_context=_logprobs_setup
)

# ---- policy_loss: an RL loss through the head, gradients from the forward ----


@torch.library.register_fake(_LIB + "policy_loss")
def _policy_loss_fake(hidden, weight, labels, valid, advantages, old_logprobs, ref_logprobs,
                      sampler_logprobs, sequence_ids, group_name, dp_group_name, kind, eps_low,
                      eps_high, dual_clip, kl, kl_coef, tis_cap, entropy_coef, aggregation,
                      divisor, softcap, temperature, logits_precision, chunk_rows, grad_hidden,
                      grad_weight, layout=None, entropy=False):  # type: ignore[no-untyped-def]
    B, L = hidden.shape[0], hidden.shape[1]
    per_position = [hidden.new_empty((B, L), dtype=torch.float32) for _ in range(5)]
    dh = torch.empty_like(hidden) if grad_hidden else hidden.new_empty((0,))
    dw = torch.empty_like(weight) if grad_weight else weight.new_empty((0,))
    return (hidden.new_empty((), dtype=torch.float32), *per_position, dh, dw)


def _policy_loss_setup(ctx: Any, inputs: tuple, output: tuple) -> None:
    ctx.save_for_backward(output[6], output[7])
    ctx.wanted = (inputs[25], inputs[26])
    ctx.mark_non_differentiable(*output[1:])
    ctx.set_materialize_grads(False)


def _policy_loss_backward(ctx: Any, grad_loss: Any, *_rest: Any) -> tuple:
    return _head_gradients(ctx, grad_loss, 29)


torch.library.register_autograd(
    _LIB + "policy_loss", _policy_loss_backward, setup_context=_policy_loss_setup
)

# ---- cp_attention: only the needed keys move; the backward returns their gradients ----


@torch.library.register_fake(_LIB + "cp_attention")
def _attention_fake(q, k, v, sinks, plan, group_name, scale, softcap):  # type: ignore[no-untyped-def]
    rows, L, hq, _ = q.shape
    received = k.new_empty((plan[4].shape[0], 2, k.shape[2], k.shape[3]))  # plan[4]: recv lists
    return torch.empty_like(q), q.new_empty((rows, hq, L), dtype=torch.float32), received


@torch.library.register_fake(_LIB + "cp_attention_backward")
def _attention_backward_fake(q, k, v, sinks, out, lse, received, grad_out, plan, group_name,
                             scale, softcap):  # type: ignore[no-untyped-def]
    dsinks = torch.empty_like(sinks) if sinks is not None else q.new_empty((0,),
                                                                             dtype=torch.float32)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), dsinks


def _attention_setup(ctx: Any, inputs: tuple, output: tuple) -> None:
    q, k, v, sinks, plan, group, scale, softcap = inputs
    ctx.save_for_backward(q, k, v, sinks, output[0], output[1], output[2], *plan)
    ctx.options = (group, scale, softcap)
    ctx.no_plan_grads = [None] * len(plan)  # the backward returns the inputs' structure
    ctx.mark_non_differentiable(output[1], output[2])
    ctx.set_materialize_grads(False)


def _attention_backward(ctx: Any, grad_out: Any, *_rest: Any) -> tuple:
    if grad_out is None:
        return None, None, None, None, ctx.no_plan_grads, None, None, None
    q, k, v, sinks, out, lse, received, *plan = ctx.saved_tensors
    dq, dk, dv, dsinks = torch.ops.cpkit.cp_attention_backward(
        q, k, v, sinks, out, lse, received, grad_out, plan, *ctx.options)
    return (dq, dk, dv, dsinks if sinks is not None else None, ctx.no_plan_grads, None, None,
            None)


torch.library.register_autograd(
    _LIB + "cp_attention", _attention_backward, setup_context=_attention_setup
)

# ---- sharding: data in, shards out (no autograd); the in-forward cut is differentiable ----


# The names of the shard op's tensors per microbatch, in the order csrc/ops.cpp writes them.
SHARD_STREAMS = tuple(torch.ops.cpkit.shard_streams())


@torch.library.register_fake(_LIB + "shard")
def _shard_fake(
    input_ids, inputs_embeds, labels, position_ids, attention_mask, seq_lens, seq_lens_padded,
    images, qkv_format, packed, group_name, num_chunks, shard_primary, pad_multiple,
    pad_token_id, layout="contiguous", balance_slack=None,
):  # type: ignore[no-untyped-def]
    cp_size, rank = _group_size_and_rank(group_name)
    batch, seq_len = labels.shape
    rows = 1 if packed else batch // num_chunks
    L = _local_length(seq_len, cp_size, rank, pad_multiple, layout)
    ctx = torch.library.get_ctx()
    out: list = []
    for _ in range(num_chunks):
        if not shard_primary:
            primary = labels.new_empty((0,))
        elif input_ids is not None:
            primary = input_ids.new_empty((rows, L))
        else:
            primary = inputs_embeds.new_empty((rows, L, inputs_embeds.shape[2]))
        stream = labels.new_empty((rows, L))
        flags = labels.new_empty((rows, L), dtype=torch.bool)
        plan = torch.empty(ctx.new_dynamic_size(), dtype=torch.long)  # fragments: data-dependent
        if packed:
            documents = ctx.new_dynamic_size()
            offsets = [torch.empty(documents + 1, dtype=torch.long) for _ in range(2)]
        else:
            offsets = [labels.new_empty((0,)) for _ in range(2)]
        named = {"primary": primary, "labels": stream, "position_ids": stream.clone(),
                 "document_ids": stream.clone(), "padding": flags,
                 "valid": labels.new_empty((rows * L,), dtype=torch.bool), "layout": plan,
                 "cu_seqlens": offsets[0], "cu_seqlens_padded": offsets[1]}
        out += [named[name] for name in SHARD_STREAMS]
    return out


@torch.library.register_fake(_LIB + "attention_offsets")
def _offsets_fake(
    input_ids, inputs_embeds, labels, position_ids, attention_mask, seq_lens, seq_lens_padded,
    qkv_format, cp_size, rank, num_chunks, pad_multiple, microbatch, layout="contiguous",
    balance_slack=None,
):  # type: ignore[no-untyped-def]
    ctx = torch.library.get_ctx()
    segments = ctx.new_dynamic_size()  # data-dependent
    offsets = [labels.new_empty((segments + 1,), dtype=torch.int32) for _ in range(2)]
    k_index = labels.new_empty((ctx.new_dynamic_size(),), dtype=torch.long)
    return offsets[0], offsets[1], torch.empty(4, dtype=torch.long), k_index


@torch.library.register_fake(_LIB + "cut_spliced")
def _cut_fake(spliced, layout, rank, rows, local_len, fill):  # type: ignore[no-untyped-def]
    return spliced.new_empty((spliced.shape[0], local_len, *spliced.shape[2:]))


@torch.library.register_fake(_LIB + "cut_spliced_backward")
def _uncut_fake(grad, layout, rank, seq_len):  # type: ignore[no-untyped-def]
    return grad.new_empty((grad.shape[0], seq_len, *grad.shape[2:]))


def _cut_setup(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
    spliced, layout, ctx.rank, _, _, _ = inputs
    ctx.save_for_backward(layout)
    ctx.seq_len = spliced.shape[1]


def _cut_backward(ctx: Any, grad: torch.Tensor) -> tuple:
    (layout,) = ctx.saved_tensors
    full = torch.ops.cpkit.cut_spliced_backward(grad, layout, ctx.rank, ctx.seq_len)
    return full, None, None, None, None, None


torch.library.register_autograd(_LIB + "cut_spliced", _cut_backward, setup_context=_cut_setup)


@torch.library.register_fake(_LIB + "restore_index")
def _restore_index_fake(layout, local):  # type: ignore[no-untyped-def]
    padded_len = torch.library.get_ctx().new_dynamic_size()  # inside the plan's values
    return local.new_empty((padded_len,), dtype=torch.long)

# ---- autocast: the fused head's GEMMs in bf16 as at::linear's are, never fp32 copies ----
# Under torch.autocast an fp32 master head reaches these ops as HF's lm_head would see it:
# hidden and weight cast to bfloat16 (the reduced precision the fused head supports; the
# casts are differentiable, so fp32 leaves get fp32 gradients). Backward ops are not
# registered: their upstream gradients must stay fp32.
for _op in ("shifted_cp_linear_loss", "token_logprobs", "policy_loss"):
    for _device in ("cpu", "cuda"):
        torch.library.register_autocast(_LIB + _op, _device, torch.bfloat16)
