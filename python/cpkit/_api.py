"""cpkit's Python API: thin wrappers over torch.ops.cpkit.* (the C++ library), with the
seed's names and the conventions of PyTorch trainers (tensors in, DeviceMesh or ProcessGroup
for the CP group)."""

from __future__ import annotations

from typing import NamedTuple, Optional, Union

import torch

from ._errors import raise_error, translate
from ._mesh import Mesh, cp_size_and_rank, group_name
from ._ops import SHARD_STREAMS

BatchValue = Union[torch.Tensor, list, str, None]
Batch = dict

# The CPBatch tensors, in the order of the shard op's schema (docs/spec.md sections 2 and 3).
_TENSOR_KEYS = (
    "input_ids", "inputs_embeds", "labels", "position_ids", "attention_mask", "seq_lens",
    "seq_lens_padded",
)


def _kind_of(value: BatchValue) -> tuple[str, str]:
    """A batch value's kind for the library's field check, and its type for the message."""
    if value is None:
        return "none", "None"
    if isinstance(value, torch.Tensor):
        return "tensor", "Tensor"
    if isinstance(value, (list, tuple)) and all(isinstance(v, torch.Tensor) for v in value):
        return "tensor_list", type(value).__name__
    return ("string" if isinstance(value, str) else "other"), type(value).__name__


@translate
def gather_tokens(value: torch.Tensor, mesh: Mesh = None, differentiable: bool = True,
                  dim: int = 0) -> torch.Tensor:
    """All-gathers ``value [N, ...]`` of every CP rank into ``[CP * N, ...]`` in rank order,
    along ``dim`` (an attention layer's ``[B, H, S, D]`` keys: ``dim=2``, no permute).

    With ``differentiable`` the backward is one reduce-scatter SUM onto the owning rank (keys
    and values of attention); without it there is no autograd edge (positions, document ids,
    padding flags). Shapes or dtypes that differ across ranks raise CPError on every rank.
    """
    name = group_name(mesh)
    if not differentiable:
        value = value.detach()
    return torch.ops.cpkit.gather_tokens(value, name, dim)


@translate
def shifted_cp_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    valid: torch.Tensor,
    mesh: Mesh = None,
    softcap: float = 0.0,
    layout: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """HF's shifted next-token cross-entropy across CP shard boundaries.

    ``logits [B, L, V]`` float32 contiguous, ``labels [B, L]`` int64 unshifted, ``valid
    [B * L]`` bool (the shard's ``valid``). Returns ``local_sum * CP / N_global`` (0-d
    float32): averaging it, and its gradients, over the CP ranks (as FSDP does) gives the
    single-device mean. ``softcap > 0`` applies ``c * tanh(z / c)`` inside the kernel. The
    backward hands out the gradient the fused forward wrote. ``layout``: the shard's
    ``"layout"`` (``Sharder.local(m)["layout"]``) when it was cut with another layout than
    contiguous; it says where each fragment's next token lives.
    """
    loss, _ = torch.ops.cpkit.shifted_cp_loss(logits, labels, valid, group_name(mesh),
                                              float(softcap), layout)
    return loss


@translate
def set_value_checks(mode: str) -> None:
    """When cpkit checks tensor *values* (labels inside the vocabulary, no ``valid`` bit on a
    -100 label, ``attention_mask`` in {0, 1}): ``"cpu_only"`` (default; for CUDA tensors each
    check would synchronise the stream), ``"always"`` or ``"never"``. With a check skipped, a
    stray label makes its row's loss NaN, never an out-of-bounds read. Shapes, dtypes and
    devices are always checked."""
    torch.ops.cpkit.set_value_checks(mode)


@translate
def shifted_cp_linear_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    valid: torch.Tensor,
    mesh: Mesh = None,
    softcap: float = 0.0,
    chunk_rows: int = 0,
    layout: Optional[torch.Tensor] = None,
    logits_precision: str = "input",
) -> torch.Tensor:
    """The LM head fused into :func:`shifted_cp_loss`: never materialises ``[B, L, V]``.

    ``hidden [B, L, H]`` and ``weight [V, H]`` (the head, ``lm_head.weight``): float32 or
    bfloat16, same dtype and device; ``labels`` and ``valid`` as for ``shifted_cp_loss``.
    Returns exactly ``shifted_cp_loss(softcap(hidden @ weight.T).float(), labels, valid,
    mesh)``, with gradients for ``hidden`` and ``weight`` computed in the forward, a chunk of
    ``chunk_rows`` token rows at a time (0: as many as fit 128 MiB of fp32 logits and at
    most 512 rows on CPU, 1 GiB on CUDA). Peak extra memory is about one chunk of logits,
    whatever ``L`` is. A gradient is computed only for an input that requires one.
    ``layout`` as for :func:`shifted_cp_loss`. ``logits_precision``: ``"input"`` (bf16 heads
    round their logits to bf16, HF's eager numerics) or ``"fp32"`` (the GEMMs' fp32 sums kept).
    """
    grad_on = torch.is_grad_enabled()
    loss, _, _ = torch.ops.cpkit.shifted_cp_linear_loss(
        hidden, weight, labels, valid, group_name(mesh), float(softcap), int(chunk_rows),
        grad_on and hidden.requires_grad, grad_on and weight.requires_grad, layout,
        str(logits_precision),
    )
    return loss


class TokenLogprobs(NamedTuple):
    """Per-token values of :func:`token_logprobs`, ``[B, L]`` in the shard's order."""

    logprobs: torch.Tensor  # float32, 0 where there is no target
    entropy: Optional[torch.Tensor]  # float32 when asked for
    has_target: torch.Tensor  # bool


@translate
def token_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    valid: torch.Tensor,
    mesh: Mesh = None,
    softcap: float = 0.0,
    temperature: float = 1.0,
    entropy: bool = False,
    logits_precision: str = "fp32",
    chunk_rows: int = 0,
    layout: Optional[torch.Tensor] = None,
) -> TokenLogprobs:
    """Each position's log-probability of its next token (and the entropy of its
    distribution) through the LM head, across CP shard boundaries, never building
    ``[B, L, V]``: what RL losses (GRPO, PPO, DPO) are made of.

    Inputs as for :func:`shifted_cp_linear_loss`; position ``j`` predicts the same target as
    there (the next global position's label). ``z = softcap(hidden @ weight.T) / temperature``;
    ``logprobs = log_softmax(z)[target]``, ``entropy = -sum softmax(z) log_softmax(z)``; 0 and
    ``has_target == False`` where there is no counted target. No reduction and no CP scale.
    Differentiable in ``hidden`` and ``weight`` for any function of the values (the backward
    recomputes the logits a chunk at a time). ``logits_precision="fp32"`` (the default) keeps a
    bf16 head's products and sums in fp32 (an fp32 copy of the head per call); ``"input"``
    rounds logits to bf16 as HF's eager path does. :func:`restore_order` puts the values in
    global order.
    """
    lp, ent, has, _, _ = torch.ops.cpkit.token_logprobs(
        hidden, weight, labels, valid, group_name(mesh), float(softcap), float(temperature),
        bool(entropy), str(logits_precision), int(chunk_rows), layout,
    )
    return TokenLogprobs(lp, ent if entropy else None, has)


class PolicyLoss(NamedTuple):
    loss: torch.Tensor      # 0-d float32: CP * DP * this rank's share of J
    logprobs: torch.Tensor  # [B, L] float32 per position, 0 where none counts (for logging)
    ratio: torch.Tensor
    clipped: torch.Tensor
    kl: torch.Tensor
    entropy: torch.Tensor


@translate
def policy_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    valid: torch.Tensor,
    advantages: torch.Tensor,
    old_logprobs: torch.Tensor,
    mesh: Mesh = None,
    *,
    dp_mesh: Mesh = None,
    ref_logprobs: Optional[torch.Tensor] = None,
    sampler_logprobs: Optional[torch.Tensor] = None,
    sequence_ids: Optional[torch.Tensor] = None,
    kind: str = "ppo",
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    dual_clip: float = 0.0,
    kl: str = "k3",
    kl_coef: float = 0.0,
    tis_cap: float = 0.0,
    entropy_coef: float = 0.0,
    entropy: bool = False,
    aggregation: str = "token_mean",
    divisor: float = 0.0,
    softcap: float = 0.0,
    temperature: float = 1.0,
    logits_precision: str = "fp32",
    chunk_rows: int = 0,
    layout: Optional[torch.Tensor] = None,
) -> PolicyLoss:
    """An RL policy-gradient loss through the LM head across CP (docs/spec.md section 5c),
    with no ``[B, L, V]`` logits and three GEMMs (four for ``"gspo"``).

    ``hidden``, ``weight``, ``labels``, ``valid``, ``mesh``, ``layout`` as for
    :func:`token_logprobs`. Per-position ``[B, L]`` float32 tensors are aligned like
    token_logprobs' output (position ``j``: predicting its target): ``advantages``,
    ``old_logprobs`` (e.g. token_logprobs under ``torch.no_grad()``), ``ref_logprobs`` (for
    ``kl_coef > 0``), ``sampler_logprobs`` (for ``tis_cap > 0``); ``sequence_ids`` = the
    shard's ``document_ids`` (for ``"gspo"`` and the ``seq_*`` aggregations). ``kind``:
    ``"ppo"`` (PPO / GRPO; ``eps_low`` / ``eps_high`` for DAPO's asymmetric clip,
    ``dual_clip``), ``"cispo"`` or ``"gspo"`` (the ratio of whole sequences, cut across ranks
    or not). ``kl``: ``"k1"``, ``"k2"``, ``"k3"``. ``entropy``: return each position's entropy
    (else 0, and its sums are skipped, unless ``entropy_coef`` uses it). ``aggregation``:
    ``"token_mean"``, ``"seq_mean_token_mean"``, ``"seq_mean_token_sum"``, ``"constant"``
    (``divisor``, Dr. GRPO); every count spans the CP mesh and ``dp_mesh``. The loss is
    ``CP * DP`` times this rank's share of the objective, so FSDP's average over the DP x CP
    ranks' gradients is the objective's gradient. Differentiable in ``hidden`` and
    ``weight``."""
    outs = torch.ops.cpkit.policy_loss(
        hidden, weight, labels, valid, advantages, old_logprobs, ref_logprobs, sampler_logprobs,
        sequence_ids, group_name(mesh), group_name(dp_mesh), str(kind), float(eps_low),
        float(eps_high), float(dual_clip), str(kl), float(kl_coef), float(tis_cap),
        float(entropy_coef), str(aggregation), float(divisor), float(softcap), float(temperature),
        str(logits_precision), int(chunk_rows),
        hidden.requires_grad and torch.is_grad_enabled(),
        weight.requires_grad and torch.is_grad_enabled(), layout, bool(entropy),
    )
    return PolicyLoss(*outs[:6])


class CpAttention(NamedTuple):
    out: torch.Tensor  # [rows, L, Hq, D], q's dtype
    lse: torch.Tensor  # [rows, Hq, L] float32, -inf where a query sees nothing


@translate
def cp_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: list,
                 mesh: Mesh = None, scale: float = 0.0, softcap: float = 0.0,
                 sinks: Optional[torch.Tensor] = None) -> CpAttention:
    """cpkit's own context-parallel attention (docs/spec.md section 4b), CPU and CUDA.

    ``q [rows, L, Hq, D]``, ``k``, ``v [rows, L, Hkv, D]`` (the shard's tokens in local
    order; GQA without repeating heads), ``plan`` = ``Sharder.attention_plan(m, window)``.
    Each rank receives only the keys its queries may see (document-causal, the window),
    attends over its own keys while they travel, then over the received ones. ``scale`` (0:
    ``1 / sqrt(D)``), ``softcap`` (Gemma 2), ``sinks [Hq]`` float32 (gpt-oss). Differentiable
    in q, k, v and sinks; key gradients return to the ranks that own the keys."""
    out, lse, _ = torch.ops.cpkit.cp_attention(q, k, v, sinks, plan, group_name(mesh),
                                               float(scale), float(softcap))
    return CpAttention(out, lse)


@translate
def pack_documents(lengths: list[int], rows: int, capacity: int,
                   window: int = 0) -> list[list[int]]:
    """Assigns one step's documents (token counts) to ``rows`` packed rows of ``capacity``
    tokens (every DP rank's microbatches) so that the rows' attention work is even
    (docs/spec.md section 2c); ``layout="balanced"`` then evens each row over its CP ranks.
    ``window``: the model's sliding window (0: none), which caps each token's work. Returns
    each row's document indices in input order. Deterministic: every rank gets the same rows.
    Raises CPError naming ``capacity`` when a document fits no row."""
    row_of = torch.ops.cpkit.pack_documents([int(n) for n in lengths], int(rows),
                                            int(capacity), int(window))
    packed: list[list[int]] = [[] for _ in range(int(rows))]
    for index, row in enumerate(row_of):
        packed[row].append(index)
    return packed


@translate
def restore_order(local: torch.Tensor, layout: torch.Tensor, mesh: Mesh = None) -> torch.Tensor:
    """Per-token values of this rank's shard ``[rows, L, ...]`` (local order, e.g. per-token
    losses) -> ``[rows, S_pad, ...]`` in global order, on every rank: ``gather_tokens`` along
    the token axis, then the layout's permutation (``restore_index``, the library's rule).
    Differentiable: each rank's tokens get the gradient summed over the ranks that used
    them. ``layout``: the shard's ``"layout"``."""
    index = torch.ops.cpkit.restore_index(layout, local)  # checks local against the plan
    return gather_tokens(local, mesh, dim=1).index_select(1, index)


class Sharder:
    """Every microbatch's shard for this rank, taken from the global sequence before the cut.

    ``local(m)`` gives a dict of tensors: ``input_ids`` or ``inputs_embeds`` (when
    ``shard_primary``), ``labels``, ``position_ids``, ``document_ids``, ``padding``,
    ``valid`` (flat ``[rows * L]``), ``layout`` (the plan, an int64 tensor the losses,
    ``restore_order`` and ``cut_spliced`` take), and for packed batches ``cu_seqlens`` and
    ``cu_seqlens_padded`` (offsets of the global row) and the attention offsets.
    ``layout(m)`` gives this rank's fragments of the global sequence, ``positions(m)`` the
    global position of each local token.
    """

    def __init__(self, batch: Batch, mesh: Mesh, num_chunks: int, shard_primary: bool,
                 pad_multiple: int, pad_token_id: int, qkv_format: str, layout: str,
                 balance_slack: Optional[float] = None) -> None:
        for key in sorted(batch):  # the library's check of each field (CPBatch)
            torch.ops.cpkit.check_batch_field(key, *_kind_of(batch[key]))
        if batch.get("labels") is None:  # the op's schema needs a tensor: the library's words
            raise_error("labels", "is missing")
        self.cp_size, self.rank = cp_size_and_rank(mesh)
        self.shard_primary = shard_primary
        self.images: list = list(batch.get("images") or [])
        self._batch = batch
        self._pad_multiple = pad_multiple
        self._pad_token_id = pad_token_id
        self._num_chunks = num_chunks
        self._layout_kind = layout
        self._balance_slack = balance_slack  # None: the library's default
        self._packed = qkv_format == "thd"
        self._format = qkv_format
        # Through the CP group: the ranks check that they shard the same batch.
        flat = torch.ops.cpkit.shard(
            *(batch.get(key) for key in _TENSOR_KEYS), self.images,
            batch.get("qkv_format", qkv_format), self._packed, group_name(mesh),
            num_chunks, shard_primary, pad_multiple, pad_token_id, layout, balance_slack,
        )
        n = len(SHARD_STREAMS)
        self._shards = [dict(zip(SHARD_STREAMS, flat[i:i + n])) for i in range(0, len(flat), n)]
        self._offsets: dict[int, dict] = {}

    @property
    def num_microbatches(self) -> int:
        return len(self._shards)

    def local(self, microbatch: int) -> dict[str, torch.Tensor]:
        """This rank's tensors of one microbatch."""
        shard = self._shard(microbatch)
        out = {name: shard[name] for name in ("labels", "position_ids", "document_ids",
                                              "padding", "valid", "layout")}
        if self.shard_primary:
            primary = shard["primary"]
            out["inputs_embeds" if primary.is_floating_point() else "input_ids"] = primary
        if self._packed:
            out["cu_seqlens"], out["cu_seqlens_padded"] = (shard["cu_seqlens"],
                                                           shard["cu_seqlens_padded"])
            out.update(self.attention_offsets(microbatch))  # always expressible for THD
        return out

    @translate
    def attention_offsets(self, microbatch: int) -> dict:
        """Varlen attention offsets of this rank's shard (docs/spec.md section 4a):
        ``cu_seqlens_q``, ``cu_seqlens_k`` (int32, on the batch's device), ``max_seqlen_q``,
        ``max_seqlen_k``, ``k_begin``, ``k_end``. Keys for the kernel are
        ``gathered_keys[..., k_begin:k_end, ...]`` (rows flattened) for the contiguous layout,
        else ``gathered_keys.flatten(0, 1)[k_index]`` (``k_index`` given only then: the rows
        of the rank-order gathered keys, a document's prefix repeated for each of its pieces
        on this rank); segments are causal with bottom-right alignment
        (flash_attn_varlen_func, torch.nn.attention.varlen). BSHD masks with padding between
        real tokens raise CPError."""
        self._shard(microbatch)
        if microbatch in self._offsets:  # computed once per microbatch
            return dict(self._offsets[microbatch])
        cu_q, cu_k, scalars, k_index = torch.ops.cpkit.attention_offsets(
            *(self._batch.get(key) for key in _TENSOR_KEYS), self._format, self.cp_size,
            self.rank, self._num_chunks, self._pad_multiple, microbatch, self._layout_kind,
            self._balance_slack,
        )
        names = ("max_seqlen_q", "max_seqlen_k", "k_begin", "k_end")
        self._offsets[microbatch] = {"cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k,
                                     **dict(zip(names, scalars.tolist()))}
        if self._layout_kind != "contiguous":
            self._offsets[microbatch]["k_index"] = k_index
        return dict(self._offsets[microbatch])

    @translate
    def attention_plan(self, microbatch: int, window: int = 0) -> list:
        """This rank's attention plan for :func:`cp_attention` (docs/spec.md section 4b):
        which keys it sends to and receives from each rank, and each query's keys, derived
        from the batch alone (no communication); ``window`` (0: none) the sliding window.
        Opaque: pass it to ``cp_attention`` as it is."""
        self._shard(microbatch)
        return torch.ops.cpkit.attention_plan(
            *(self._batch.get(key) for key in _TENSOR_KEYS), self._format, self.cp_size,
            self.rank, self._num_chunks, self._pad_multiple, microbatch, self._layout_kind,
            int(window), self._balance_slack,
        )

    def layout(self, microbatch: int) -> dict:
        """``seq_len``, ``padded_len``, ``local_len`` and ``fragments`` (this rank's global
        ``(begin, end)`` ranges, in local order); for the contiguous layout also ``begin`` and
        ``end`` of its one range."""
        values = torch.ops.cpkit.layout_fragments(self._shard(microbatch)["layout"], self.rank)
        out = dict(zip(("seq_len", "padded_len", "local_len"), values[:3]))
        out["fragments"] = list(zip(values[3::2], values[4::2]))
        if self._layout_kind == "contiguous":
            out["begin"], out["end"] = out["fragments"][0]
        return out

    def positions(self, microbatch: int) -> torch.Tensor:
        """The global (padded) position of each of this rank's local tokens, in local order:
        ``global_tensor[:, positions]`` is this rank's part of any per-token tensor."""
        return torch.cat([torch.arange(b, e) for b, e in self.layout(microbatch)["fragments"]])

    def global_primary(self, microbatch: int) -> torch.Tensor:
        """shard_primary=False: the microbatch's global, unpadded ids or embeddings."""
        rows = self._rows(microbatch)  # checks the index
        primary = self._batch.get("input_ids")
        if primary is None:
            primary = self._batch["inputs_embeds"]
        return primary[microbatch * rows:(microbatch + 1) * rows]

    @translate
    def cut_spliced(self, microbatch: int, spliced: torch.Tensor) -> torch.Tensor:
        """The in-forward cut of the model's spliced ``[rows, S, H]`` embeddings (or ids) of
        one microbatch, exactly like every other stream; differentiable for embeddings."""
        plan = self._shard(microbatch)["layout"]
        fill = 0.0 if spliced.is_floating_point() else float(self._pad_token_id)
        local_len = self.layout(microbatch)["local_len"]
        return torch.ops.cpkit.cut_spliced(spliced, plan, self.rank, self._rows(microbatch),
                                           local_len, fill)

    def _rows(self, microbatch: int) -> int:
        """The microbatch's rows, as the library cut them (its labels are [rows, L])."""
        return self._shard(microbatch)["labels"].shape[0]

    def _shard(self, microbatch: int) -> dict[str, torch.Tensor]:
        if not 0 <= microbatch < self.num_microbatches:
            raise_error("microbatch", f"must be in [0, {self.num_microbatches}), got {microbatch}")
        return self._shards[microbatch]


@translate
def prepare_cp_inputs(
    batch: Batch,
    num_chunks: int = 1,
    shard_primary: bool = True,
    *,
    mesh: Mesh = None,
    pad_multiple: int = 1,
    pad_token_id: int = 0,
    layout: str = "contiguous",
) -> Sharder:
    """Shards a BSHD batch (``qkv_format`` "bshd"): ``num_chunks`` splits the batch axis.
    ``layout``: "contiguous" or "head_tail" (docs/spec.md section 2b)."""
    return Sharder(batch, mesh, num_chunks, shard_primary, pad_multiple, pad_token_id, "bshd",
                   layout)


@translate
def prepare_packed_cp_inputs(
    batch: Batch,
    num_chunks: int,
    shard_primary: bool = True,
    *,
    mesh: Mesh = None,
    pad_multiple: int = 1,
    pad_token_id: int = 0,
    layout: str = "contiguous",
    balance_slack: Optional[float] = None,
) -> Sharder:
    """Shards packed documents (``qkv_format`` "thd"): one packed row per microbatch, so
    ``num_chunks`` rows; ``seq_lens`` / ``seq_lens_padded`` ``[num_chunks, D]`` end ragged
    lists with -1000. ``layout``: "contiguous", "head_tail" or "balanced" (documents of any
    length spread so every rank does about the same causal attention work; docs/spec.md 2b).
    ``balance_slack`` (balanced): how far above even the ranks' work and tile cost may be for
    the plan to cut fewer documents and so move fewer keys; None: the library's default
    (0.02), 0: the most even plan."""
    return Sharder(batch, mesh, num_chunks, shard_primary, pad_multiple, pad_token_id, "thd",
                   layout, balance_slack)

