"""cpkit: context parallelism for long-context LLM training, as PyTorch ops.

One sequence is cut into contiguous shards, one per CP rank. ``prepare_cp_inputs`` /
``prepare_packed_cp_inputs`` give each rank its tensors (positions and document ids taken
before the cut), ``gather_tokens`` moves keys and values between ranks with correct
gradients, and ``shifted_cp_loss`` is HF's shifted next-token loss across shard boundaries,
scaled CP / N_global; ``shifted_cp_linear_loss`` fuses the LM head into it, and
``token_logprobs`` gives each token's log-probability and entropy through the head (for RL
losses). Every operation is the C++ library's, registered as
``torch.ops.cpkit.*`` (see docs/python.md).
"""

from __future__ import annotations

import pathlib

import torch

torch.ops.load_library(str(pathlib.Path(__file__).with_name("_C.so")))

from . import _ops  # noqa: E402,F401  (autograd and fake kernels)
from ._api import (  # noqa: E402
    CpAttention,
    PolicyLoss,
    Sharder,
    TokenLogprobs,
    cp_attention,
    gather_tokens,
    pack_documents,
    prepare_cp_inputs,
    policy_loss,
    prepare_packed_cp_inputs,
    restore_order,
    set_value_checks,
    shifted_cp_linear_loss,
    shifted_cp_loss,
    token_logprobs,
)
from ._errors import CPError  # noqa: E402

__all__ = [
    "CPError",
    "CpAttention",
    "PolicyLoss",
    "Sharder",
    "TokenLogprobs",
    "cp_attention",
    "gather_tokens",
    "pack_documents",
    "prepare_cp_inputs",
    "policy_loss",
    "prepare_packed_cp_inputs",
    "restore_order",
    "set_value_checks",
    "shifted_cp_linear_loss",
    "shifted_cp_loss",
    "token_logprobs",
]
__version__ = "0.2.2"
