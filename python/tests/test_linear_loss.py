"""shifted_cp_linear_loss in one process: against PyTorch's own head + F.cross_entropy in
float32 and bfloat16, only the gradients asked for, opcheck, torch.compile, bad input. The
CP > 1 checks run under torchrun (cp_worker.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import cpkit

IGNORE = -100


def _case(dtype: torch.dtype, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(2, 9, 16, generator=generator).to(dtype)
    weight = (torch.randn(301, 16, generator=generator) * 0.5).to(dtype)
    labels = torch.randint(0, 301, (2, 9), generator=generator)
    labels[1, 4] = IGNORE
    valid = (labels != IGNORE).flatten()
    return hidden, weight, labels, valid


def _truth(hidden, weight, labels, softcap):
    """HF: the head in the inputs' dtype, logits.float(), shifted mean CE."""
    logits = (hidden @ weight.T).float()
    if softcap > 0:
        logits = softcap * torch.tanh(logits / softcap)
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                           labels[:, 1:].reshape(-1), ignore_index=IGNORE)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("softcap, chunk_rows", [(0.0, 0), (0.0, 4), (5.0, 7)])
def test_equals_head_then_cross_entropy(dtype, tol, softcap, chunk_rows):
    hidden, weight, labels, valid = _case(dtype)
    h1, w1 = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    loss = cpkit.shifted_cp_linear_loss(h1, w1, labels, valid, softcap=softcap,
                                        chunk_rows=chunk_rows)
    loss.backward()
    h2, w2 = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    truth = _truth(h2, w2, labels, softcap)
    truth.backward()
    assert loss.dtype == torch.float32 and h1.grad.dtype == dtype and w1.grad.dtype == dtype
    torch.testing.assert_close(loss, truth, rtol=tol, atol=tol)
    torch.testing.assert_close(h1.grad.float(), h2.grad.float(), rtol=tol, atol=tol)
    torch.testing.assert_close(w1.grad.float(), w2.grad.float(), rtol=tol, atol=tol)


def test_autocast_runs_the_head_in_bf16_like_linear():
    """Under torch.autocast an fp32 master head goes through the fused loss as HF's lm_head
    (at::linear) would: hidden and weight in bf16, fp32 gradients for the fp32 leaves; equal
    to the same call on bf16 copies outside autocast."""
    hidden, weight, labels, valid = _case(torch.float32, seed=5)
    h, w = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert F.linear(h, w).dtype == torch.bfloat16  # what the model's head would do
        loss = cpkit.shifted_cp_linear_loss(h, w, labels, valid)
        logprobs = cpkit.token_logprobs(h, w, labels, valid).logprobs
    loss.backward()
    assert h.grad.dtype == torch.float32 and w.grad.dtype == torch.float32
    hb = hidden.bfloat16().requires_grad_(True)
    wb = weight.bfloat16().requires_grad_(True)
    expected = cpkit.shifted_cp_linear_loss(hb, wb, labels, valid)
    expected.backward()
    torch.testing.assert_close(loss, expected, rtol=0, atol=0)
    torch.testing.assert_close(h.grad, hb.grad.float(), rtol=0, atol=0)
    torch.testing.assert_close(w.grad, wb.grad.float(), rtol=0, atol=0)
    torch.testing.assert_close(logprobs, cpkit.token_logprobs(hb, wb, labels, valid).logprobs,
                               rtol=0, atol=0)


def test_upstream_scales_both_gradients():
    hidden, weight, labels, valid = _case(torch.float32, seed=3)
    h, w = hidden.requires_grad_(True), weight.requires_grad_(True)
    loss = cpkit.shifted_cp_linear_loss(h, w, labels, valid)
    dh1, dw1 = torch.autograd.grad(loss, (h, w), retain_graph=True)
    dh2, dw2 = torch.autograd.grad(loss, (h, w), torch.tensor(-2.5))
    torch.testing.assert_close(dh2, dh1 * -2.5)
    torch.testing.assert_close(dw2, dw1 * -2.5)


def test_frozen_head_gets_no_gradient(monkeypatch):
    hidden, weight, labels, valid = _case(torch.float32, seed=4)
    asked = []
    real = torch.ops.cpkit.shifted_cp_linear_loss

    def spy(*args):
        asked.append(args[7:9])  # grad_hidden, grad_weight
        return real(*args)

    monkeypatch.setattr(torch.ops.cpkit, "shifted_cp_linear_loss", spy)
    h = hidden.requires_grad_(True)
    cpkit.shifted_cp_linear_loss(h, weight, labels, valid).backward()
    assert h.grad is not None and weight.grad is None
    with torch.no_grad():
        cpkit.shifted_cp_linear_loss(h, weight, labels, valid)
    assert asked == [(True, False), (False, False)]


def test_opcheck(world1):
    hidden, weight, labels, valid = _case(torch.float32, seed=5)
    for group in (world1.group_name, ""):
        for wanted in ((True, True), (True, False), (False, True)):
            args = (hidden.clone().requires_grad_(wanted[0]), weight.clone().requires_grad_(wanted[1]),
                    labels, valid, group, 3.0, 4) + wanted
            torch.library.opcheck(torch.ops.cpkit.shifted_cp_linear_loss, args)


def test_compile_fullgraph_equals_eager():
    hidden, weight, labels, valid = _case(torch.float32, seed=6)

    def step(h, w):
        return cpkit.shifted_cp_linear_loss(torch.tanh(h), w, labels, valid, chunk_rows=5)

    results = []
    for function in (step, torch.compile(step, fullgraph=True)):
        h, w = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
        loss = function(h, w)
        loss.backward()
        results.append((loss.detach(), h.grad, w.grad))
    for eager, compiled in zip(*results):
        torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("change, argument, fragment", [
    (lambda h, w: (h, w.to(torch.bfloat16)), "weight", "BFloat16"),
    (lambda h, w: (h, w[:, :15]), "weight", "H = 16"),
    (lambda h, w: (h, w.unsqueeze(0)), "weight", "2 dimensions"),
    (lambda h, w: (h.double(), w.double()), "hidden", "float32 or bfloat16"),
    (lambda h, w: (h[:, :0], w), "hidden", "empty batch"),
])
def test_bad_input_names_the_argument(change, argument, fragment):
    hidden, weight, labels, valid = _case(torch.float32)
    h, w = change(hidden, weight)
    if h.shape[1] == 0:
        labels, valid = labels[:, :0], valid[:0]
    with pytest.raises(cpkit.CPError, match=argument) as error:
        cpkit.shifted_cp_linear_loss(h, w, labels, valid)
    assert fragment in str(error.value)


def test_value_checks_switch():
    hidden, weight, labels, valid = _case(torch.float32, seed=7)
    labels[0, 3] = 301  # outside [0, 301)
    with pytest.raises(cpkit.CPError, match="labels"):
        cpkit.shifted_cp_linear_loss(hidden, weight, labels, valid)
    try:
        cpkit.set_value_checks("never")
        assert torch.isnan(cpkit.shifted_cp_linear_loss(hidden, weight, labels, valid))
    finally:
        cpkit.set_value_checks("cpu_only")
    with pytest.raises(cpkit.CPError, match="mode"):
        cpkit.set_value_checks("sometimes")
