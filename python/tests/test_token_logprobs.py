"""token_logprobs in one process: against F.log_softmax in fp64 (values, entropy, gradients of
any function of them), bf16 heads under both logits precisions, only the gradients asked
for, opcheck, torch.compile, bad input. The CP > 1 checks (and a GRPO loss) run under
torchrun (cp_worker.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import cpkit

IGNORE = -100


def _case(dtype: torch.dtype, seed: int = 0, S: int = 9, V: int = 301, scale: float = 2.0):
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(2, S, 16, generator=generator).to(dtype)
    weight = (torch.randn(V, 16, generator=generator) * scale / 4).to(dtype)
    labels = torch.randint(0, V, (2, S), generator=generator)
    labels[1, 4] = IGNORE
    valid = (labels != IGNORE).flatten()
    upstream = torch.randn(2, 2, S, generator=generator)
    return hidden, weight, labels, valid, upstream


def _truth(hidden, weight, labels, softcap=0.0, temperature=1.0):
    """fp64 on the same values: log_softmax at each position of its next label."""
    z = hidden.double() @ weight.double().T
    z = (softcap * torch.tanh(z / softcap) if softcap > 0 else z) / temperature
    log_p = F.log_softmax(z, dim=-1)
    targets = torch.full_like(labels, IGNORE)
    targets[:, :-1] = labels[:, 1:]
    has = targets != IGNORE
    lp = log_p.gather(-1, targets.clamp_min(0).unsqueeze(-1)).squeeze(-1) * has
    return lp, -(log_p.exp() * log_p).sum(-1) * has, has


@pytest.mark.parametrize("softcap, temperature, chunk_rows", [
    (0.0, 1.0, 0), (0.0, 0.6, 4), (5.0, 1.0, 7), (3.0, 1.4, 1)])
def test_equals_fp64_log_softmax(softcap, temperature, chunk_rows):
    hidden, weight, labels, valid, up = _case(torch.float32)
    h1, w1 = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    out = cpkit.token_logprobs(h1, w1, labels, valid, softcap=softcap, temperature=temperature,
                               entropy=True, chunk_rows=chunk_rows)
    ((out.logprobs * up[0]).sum() + (out.entropy * up[1]).sum()).backward()
    h2, w2 = hidden.double().requires_grad_(True), weight.double().requires_grad_(True)
    lp, ent, has = _truth(h2, w2, labels, softcap, temperature)
    ((lp * up[0]).sum() + (ent * up[1]).sum()).backward()
    assert out.logprobs.dtype == torch.float32 and out.has_target.dtype == torch.bool
    assert torch.equal(out.has_target, has)
    assert (out.logprobs <= 0).all() and (out.entropy >= 0).all()
    torch.testing.assert_close(out.logprobs.double(), lp.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.entropy.double(), ent.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(h1.grad.double(), h2.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(w1.grad.double(), w2.grad, rtol=1e-4, atol=1e-5)


def test_entropy_alone_leaves_the_logprob_upstream_none():
    """A loss of the entropy only: the op's backward gets no log-prob upstream (None, zero in
    the kernel) and the gradients are the fp64 entropy's."""
    hidden, weight, labels, valid, up = _case(torch.float32, seed=4)
    h1, w1 = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    (cpkit.token_logprobs(h1, w1, labels, valid, entropy=True).entropy * up[1]).sum().backward()
    h2, w2 = hidden.double().requires_grad_(True), weight.double().requires_grad_(True)
    (_truth(h2, w2, labels)[1] * up[1]).sum().backward()
    torch.testing.assert_close(h1.grad.double(), h2.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(w1.grad.double(), w2.grad, rtol=1e-4, atol=1e-5)


def test_bfloat16_precisions():
    """fp32 (the default) keeps the GEMM's fp32 sums: within 2e-4 of fp64 on the same bf16
    values; "input" rounds logits to bf16 (HF's eager numerics) and misses that by far."""
    hidden, weight, labels, valid, _ = _case(torch.bfloat16, seed=1, S=64, V=512, scale=8.0)
    lp, _, _ = _truth(hidden, weight, labels)
    exact = cpkit.token_logprobs(hidden, weight, labels, valid).logprobs
    rounded = cpkit.token_logprobs(hidden, weight, labels, valid, logits_precision="input").logprobs
    assert (exact.double() - lp).abs().max() <= 2e-4
    assert (rounded.double() - lp).abs().max() > 2e-4
    # The fused loss takes the same option; "input" stays its default (HF-exact).
    loss_exact = cpkit.shifted_cp_linear_loss(hidden, weight, labels, valid,
                                              logits_precision="fp32")
    truth = -lp.sum() / (labels[:, 1:] != IGNORE).sum()
    assert abs(loss_exact.item() - truth.item()) <= 1e-6 * abs(truth.item())


def test_frozen_head_gets_no_gradient(monkeypatch):
    hidden, weight, labels, valid, _ = _case(torch.float32, seed=4)
    asked = []
    real = torch.ops.cpkit.token_logprobs_backward

    def spy(*args):
        asked.append(args[10:12])  # grad_hidden, grad_weight
        return real(*args)

    monkeypatch.setattr(torch.ops.cpkit, "token_logprobs_backward", spy)
    h = hidden.requires_grad_(True)
    out = cpkit.token_logprobs(h, weight, labels, valid)
    assert out.entropy is None
    out.logprobs.sum().backward()
    assert h.grad is not None and weight.grad is None
    assert asked == [(True, False)]


def test_opcheck(world1):
    hidden, weight, labels, valid, _ = _case(torch.float32, seed=5)
    for group in (world1.group_name, ""):
        for entropy in (True, False):
            args = (hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True),
                    labels, valid, group, 3.0, 0.8, entropy, "fp32", 4)
            torch.library.opcheck(torch.ops.cpkit.token_logprobs, args)


def test_compile_fullgraph_equals_eager():
    hidden, weight, labels, valid, up = _case(torch.float32, seed=6)

    def step(h, w):
        out = cpkit.token_logprobs(torch.tanh(h), w, labels, valid, entropy=True, chunk_rows=5)
        return (out.logprobs * up[0]).sum() + (out.entropy * up[1]).sum()

    results = []
    for function in (step, torch.compile(step, fullgraph=True)):
        h, w = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
        value = function(h, w)
        value.backward()
        results.append((value.detach(), h.grad, w.grad))
    for eager, compiled in zip(*results):
        torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kwargs, argument, fragment", [
    ({"temperature": 0.0}, "temperature", "got 0"),
    ({"temperature": float("nan")}, "temperature", "nan"),
    ({"logits_precision": "fp16"}, "logits_precision", '"fp16"'),
    ({"softcap": -1.0}, "softcap", "-1"),
    ({"chunk_rows": -2}, "chunk_rows", "-2"),
])
def test_bad_input_names_the_argument(kwargs, argument, fragment):
    hidden, weight, labels, valid, _ = _case(torch.float32)
    with pytest.raises(cpkit.CPError, match=argument) as error:
        cpkit.token_logprobs(hidden, weight, labels, valid, **kwargs)
    assert fragment in str(error.value)
