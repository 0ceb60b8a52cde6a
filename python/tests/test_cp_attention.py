"""cp_attention from Python in one process (CP 1): values, log-sum-exp and gradients against
attention written out in torch in double (attention_truth.py) for GQA, sliding windows, the
soft cap and sinks; the op's fake and autograd registrations (opcheck); bad plans. CP 2-4 run
in the torchrun worlds (cp_checks_tokens.check_cp_attention)."""

from __future__ import annotations

import pytest
import torch

import cpkit
from attention_truth import attention

BATCH = {"input_ids": torch.ones(1, 22, dtype=torch.long),
         "labels": torch.ones(1, 22, dtype=torch.long),
         "seq_lens": torch.tensor([[5, 0, 9, 3]]), "seq_lens_padded": torch.tensor([[5, 1, 10, 3]]),
         "qkv_format": "thd"}


def _inputs(seed: int, T: int = 22):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, T, h, 3, generator=g) for h in (4, 2, 2))
    return q, k, v, torch.randn(1, T, 4, 3, generator=g), torch.randn(4, generator=g)


@pytest.mark.parametrize("window", [0, 3])
@pytest.mark.parametrize("softcap", [0.0, 1.5])
@pytest.mark.parametrize("with_sinks", [False, True])
def test_one_rank_equals_attention_in_double(window, softcap, with_sinks):
    sharder = cpkit.prepare_packed_cp_inputs(BATCH, 1)
    whole = sharder.local(0)
    plan = sharder.attention_plan(0, window)
    q, k, v, d_out, sinks = _inputs(window + 10 * with_sinks)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v, sinks)]
    got = cpkit.cp_attention(*leaves[:3], plan, scale=0.4, softcap=softcap,
                             sinks=leaves[3] if with_sinks else None)
    exact = [t.double().requires_grad_(True) for t in (q[0], k[0], v[0], sinks)]
    want, lse = attention(*exact[:3], {key: whole[key][0] for key in
                                       ("position_ids", "document_ids", "padding")},
                          window, 0.4, softcap, exact[3] if with_sinks else None)
    torch.testing.assert_close(got.out[0].double(), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.lse[0].double(), lse, rtol=1e-5, atol=1e-5)
    n = 4 if with_sinks else 3
    grads = torch.autograd.grad(got.out, leaves[:n], d_out)
    truths = torch.autograd.grad(want, exact[:n], d_out[0].double())
    for name, g, t in zip("qkvs", grads, truths):
        torch.testing.assert_close(g.squeeze(0).double(), t, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_is_float32_rounded_once(dtype):
    """Half-precision inputs: the output exactly the float32 op's on the same values, rounded
    to the inputs' dtype; the gradients of that dtype, within its rounding of float32's."""
    sharder = cpkit.prepare_packed_cp_inputs(BATCH, 1)
    plan = sharder.attention_plan(0, 3)
    q, k, v, d_out, _ = (t.to(dtype) for t in _inputs(5))
    half = [t.clone().requires_grad_(True) for t in (q, k, v)]
    single = [t.float().requires_grad_(True) for t in (q, k, v)]
    got, want = (cpkit.cp_attention(*ins, plan, softcap=1.5) for ins in (half, single))
    assert got.out.dtype == dtype
    torch.testing.assert_close(got.out, want.out.to(dtype), rtol=0, atol=0)
    grads = torch.autograd.grad(got.out, half, d_out)
    truths = torch.autograd.grad(want.out, single, d_out.float())
    for name, g, t in zip("qkv", grads, truths):
        assert g.dtype == dtype
        torch.testing.assert_close(g.float(), t, rtol=2e-2, atol=2e-2, msg=name)


def test_opcheck():
    sharder = cpkit.prepare_packed_cp_inputs(BATCH, 1)
    plan = sharder.attention_plan(0, 2)
    q, k, v, _, sinks = _inputs(1)
    args = (q.requires_grad_(True), k.requires_grad_(True), v.requires_grad_(True),
            sinks.requires_grad_(True), plan, "", 0.0, 0.0)
    torch.library.opcheck(torch.ops.cpkit.cp_attention, args)


def test_plan_and_inputs_that_do_not_fit_raise():
    sharder = cpkit.prepare_packed_cp_inputs(BATCH, 1)
    plan = sharder.attention_plan(0)
    q, k, v, _, _ = _inputs(2)
    with pytest.raises(cpkit.CPError, match="argument 'plan'.*not an attention plan"):
        cpkit.cp_attention(q, k, v, plan[:3])
    with pytest.raises(cpkit.CPError, match=r"argument 'plan'.*\[1, 22\].*\[1, 21"):
        cpkit.cp_attention(q[:, :21], k[:, :21], v[:, :21], plan)
    with pytest.raises(cpkit.CPError, match="argument 'window'.*-1"):
        sharder.attention_plan(0, -1)
