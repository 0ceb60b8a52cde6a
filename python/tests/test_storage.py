"""The Python layer copies neither logits nor gradients: backward hands out the storage the
fused kernel wrote (scaled in place for any other upstream), and forward reads the caller's
logits in place."""

from __future__ import annotations

import pytest
import torch

import cpkit


def _inputs():
    generator = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 6, 300, generator=generator, requires_grad=True)
    labels = torch.randint(0, 300, (2, 6), generator=generator)
    valid = torch.ones(12, dtype=torch.bool)
    valid[0] = False
    return logits, labels, valid


def test_backward_hands_out_the_kernel_gradient():
    logits, labels, valid = _inputs()
    loss, kernel_grad = torch.ops.cpkit.shifted_cp_loss(logits, labels, valid, "", 0.0)
    (grad,) = torch.autograd.grad(loss, logits)
    assert grad.data_ptr() == kernel_grad.data_ptr()
    # Any other upstream scales that same storage in place (no second [B, L, V] buffer).
    loss, kernel_grad = torch.ops.cpkit.shifted_cp_loss(logits, labels, valid, "", 0.0)
    unit = kernel_grad.clone()
    (half,) = torch.autograd.grad(loss, logits, torch.tensor(0.5))
    assert half.data_ptr() == kernel_grad.data_ptr()
    torch.testing.assert_close(half, unit * 0.5)


def test_second_backward_through_a_retained_graph_raises():
    """The in-place scaling serves one backward; a second one raises instead of scaling the
    already scaled gradient again."""
    logits, labels, valid = _inputs()
    loss = cpkit.shifted_cp_loss(logits, labels, valid)
    torch.autograd.grad(loss, logits, torch.tensor(2.0), retain_graph=True)
    with pytest.raises(cpkit.CPError, match="retain_graph"):
        torch.autograd.grad(loss, logits, torch.tensor(2.0))


def test_public_loss_matches_the_op_and_plain_torch():
    logits, labels, valid = _inputs()
    loss = cpkit.shifted_cp_loss(logits, labels, valid)
    loss.backward()
    targets = torch.where(valid.view(2, 6), labels, -100)[:, 1:]
    truth_logits = logits.detach().clone().requires_grad_(True)
    truth = torch.nn.functional.cross_entropy(truth_logits[:, :-1].reshape(-1, 300),
                                              targets.reshape(-1), ignore_index=-100)
    truth.backward()
    torch.testing.assert_close(loss, truth)
    torch.testing.assert_close(logits.grad, truth_logits.grad)


def test_backward_touches_no_other_logits_sized_tensor():
    """Nothing in the backward writes a [B, L, V] tensor: no zero gradient materialised for
    the op's second output, no copy of the kernel's gradient."""
    logits, labels, valid = _inputs()
    loss = cpkit.shifted_cp_loss(logits, labels, valid)
    with torch.profiler.profile(record_shapes=True) as profile:
        torch.autograd.grad(loss, logits)
    shape = list(logits.shape)
    touched = [event.name for event in profile.events()
               if any(list(s) == shape for s in event.input_shapes if isinstance(s, list))
               and not event.name.startswith(("cpkit::", "GeneratedBackward", "autograd::"))]
    assert touched == [], touched


def test_fused_head_hands_out_its_gradients_for_a_unit_upstream():
    """The library's rule (leaves_gradient_as_is): an upstream of exactly 1 on the CPU hands
    out the gradients the forward computed, unscaled and uncopied; any other scales them."""
    generator = torch.Generator().manual_seed(2)
    hidden = torch.randn(1, 6, 8, generator=generator, requires_grad=True)
    weight = torch.randn(20, 8, generator=generator, requires_grad=True)
    labels = torch.randint(0, 20, (1, 6), generator=generator)
    valid = torch.ones(6, dtype=torch.bool)
    args = (hidden, weight, labels, valid, "", 0.0, 0, True, True, None)
    loss, dh, dw = torch.ops.cpkit.shifted_cp_linear_loss(*args)
    gh, gw = torch.autograd.grad(loss, (hidden, weight))
    assert gh.data_ptr() == dh.data_ptr() and gw.data_ptr() == dw.data_ptr()
    loss, dh, dw = torch.ops.cpkit.shifted_cp_linear_loss(*args)
    gh, gw = torch.autograd.grad(loss, (hidden, weight), torch.tensor(0.5))
    assert gh.data_ptr() != dh.data_ptr()
    torch.testing.assert_close(gh, dh * 0.5)
    torch.testing.assert_close(gw, dw * 0.5)
