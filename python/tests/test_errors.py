"""Bad input from Python: a clear cpkit.CPError naming the argument and the values, never a
crash."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh

import cpkit

IGNORE = -100


def _loss_inputs():
    logits = torch.randn(1, 4, 8)
    labels = torch.tensor([[1, 2, 3, 4]])
    valid = torch.tensor([False, True, True, True])
    return logits, labels, valid


def _packed():
    return {"input_ids": torch.ones(1, 10, dtype=torch.long),
            "labels": torch.ones(1, 10, dtype=torch.long),
            "seq_lens": torch.tensor([[3, 4]]), "seq_lens_padded": torch.tensor([[3, 4]]),
            "qkv_format": "thd"}


@pytest.mark.parametrize("cap", [-1.0, float("nan"), float("inf")])
def test_softcap_negative_or_not_finite_is_named(cap):
    logits, labels, valid = _loss_inputs()
    with pytest.raises(cpkit.CPError, match="argument 'softcap': must be finite and >= 0"):
        cpkit.shifted_cp_loss(logits, labels, valid, softcap=cap)
    with pytest.raises(cpkit.CPError, match="argument 'softcap': must be finite and >= 0"):
        cpkit.shifted_cp_linear_loss(torch.randn(1, 4, 3), torch.randn(8, 3), labels, valid,
                                     softcap=cap)


def test_error_is_a_value_error():
    assert issubclass(cpkit.CPError, ValueError)


@pytest.mark.parametrize(
    "change, argument, text",
    [
        (lambda l, y, v: (l.double(), y, v), "logits", "Float"),
        (lambda l, y, v: (l[0], y, v), "logits", "3 dimensions"),
        (lambda l, y, v: (l, y.int(), v), "labels", "Long"),
        (lambda l, y, v: (l, y + 10, v), "labels", "outside the vocabulary [0, 8)"),
        (lambda l, y, v: (l, y, v[:3]), "valid", "3 entries but B * L = 4"),
        (lambda l, y, v: (l.transpose(1, 2).contiguous().transpose(1, 2), y, v), "logits",
         "contiguous"),
        (lambda l, y, v: (l[:, :0], y[:, :0], v[:0]), "logits", "empty batch"),
    ],
)
def test_loss_rejects(change, argument, text):
    logits, labels, valid = change(*_loss_inputs())
    with pytest.raises(cpkit.CPError) as error:
        cpkit.shifted_cp_loss(logits, labels, valid)
    message = str(error.value)
    assert f"argument '{argument}'" in message and text in message, message


def test_lengths_that_do_not_sum():
    batch = _packed()
    batch["seq_lens_padded"] = torch.tensor([[6, 7]])
    with pytest.raises(cpkit.CPError, match="argument 'seq_lens_padded'.*sum to 13.*T = 10"):
        cpkit.prepare_packed_cp_inputs(batch, 1)


def test_wrong_shapes_and_fields():
    batch = _packed()
    with pytest.raises(cpkit.CPError, match="argument 'num_chunks'"):
        cpkit.prepare_packed_cp_inputs(batch, 2)
    with pytest.raises(cpkit.CPError, match="argument 'qkv_format'"):
        cpkit.prepare_cp_inputs(batch)
    with pytest.raises(cpkit.CPError, match="argument 'lables'.*not a CPBatch field"):
        cpkit.prepare_cp_inputs({"input_ids": torch.ones(1, 3, dtype=torch.long),
                                 "lables": torch.ones(1, 3, dtype=torch.long)})
    with pytest.raises(cpkit.CPError, match="argument 'input_ids'.*shape"):
        cpkit.prepare_cp_inputs({"input_ids": torch.ones(1, 4, dtype=torch.long),
                                 "labels": torch.ones(1, 3, dtype=torch.long)})
    with pytest.raises(cpkit.CPError, match="argument 'labels'.*-5"):
        cpkit.prepare_cp_inputs({"input_ids": torch.ones(1, 3, dtype=torch.long),
                                 "labels": torch.tensor([[1, -5, 2]])})
    with pytest.raises(cpkit.CPError, match="argument 'microbatch'"):
        cpkit.prepare_packed_cp_inputs(_packed(), 1).local(3)


def test_a_mesh_that_is_not_cp(world1):
    mesh = init_device_mesh("cpu", (1, 1), mesh_dim_names=("dp", "cp"))
    with pytest.raises(cpkit.CPError, match="argument 'mesh'.*2-D DeviceMesh.*mesh\\['cp'\\]"):
        cpkit.gather_tokens(torch.zeros(2, 2), mesh)
    with pytest.raises(cpkit.CPError, match="argument 'mesh'.*got str"):
        cpkit.shifted_cp_loss(*_loss_inputs(), mesh="cp")
    # The named CP dimension of the same mesh is accepted.
    assert cpkit.gather_tokens(torch.zeros(2, 2), mesh["cp"]).shape == (2, 2)


def test_group_name_of_no_live_group():
    # The raw op raises ValueError (cpkit's Python functions turn it into CPError).
    with pytest.raises(ValueError, match="argument 'group_name'.*no live process group"):
        torch.ops.cpkit.gather_tokens(torch.zeros(2, 2), "no-such-group")


def test_layouts_that_do_not_apply_or_do_not_match():
    bshd = {"input_ids": torch.ones(1, 8, dtype=torch.long),
            "labels": torch.ones(1, 8, dtype=torch.long)}
    with pytest.raises(cpkit.CPError, match="argument 'layout'.*\"balanced\" plans packed"):
        cpkit.prepare_cp_inputs(bshd, layout="balanced")
    with pytest.raises(cpkit.CPError, match="argument 'layout'.*got \"zigzag\""):
        cpkit.prepare_packed_cp_inputs(_packed(), 1, layout="zigzag")
    # A plan that is not the shard's: the loss names it.
    with pytest.raises(cpkit.CPError, match="argument 'layout'.*not a cpkit layout"):
        cpkit.shifted_cp_loss(*_loss_inputs(), layout=torch.tensor([7, 1, 2, 2, 2, 1, 0, 2]))
    with pytest.raises(cpkit.CPError, match="argument 'layout'.*not a cpkit layout"):
        cpkit.shifted_cp_loss(*_loss_inputs(), layout=torch.ones(3))


def test_images_are_checked_by_the_library():
    ids = {"input_ids": torch.ones(1, 3, dtype=torch.long),
           "labels": torch.ones(1, 3, dtype=torch.long)}
    with pytest.raises(cpkit.CPError, match="argument 'images': image 0 has 2 dimensions"):
        cpkit.prepare_cp_inputs({**ids, "images": [torch.zeros(3, 4)]})
    with pytest.raises(cpkit.CPError, match="argument 'images': must be a list of tensors"):
        cpkit.prepare_cp_inputs({**ids, "images": torch.zeros(2, 3, 4, 4)})
    images = [torch.zeros(3, 4, 4)]
    assert cpkit.prepare_cp_inputs({**ids, "images": images}).images[0] is images[0]
