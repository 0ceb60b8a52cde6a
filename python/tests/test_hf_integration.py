"""cpkit.integrations.transformers: tiny HF models (config only) under torchrun at CP 2, 3 and 4
against one-process HF (hf_worker.py), the dp 2 x cp 2 FSDP2 example
(examples/python/train_hf_llama.py), and bad input in one process."""

from __future__ import annotations

import copy
import os
import re
import subprocess

import pytest
import torch

import cpkit
from conftest import HERE

transformers = pytest.importorskip("transformers")  # installed by scripts/setup.sh
from cpkit.integrations import transformers as cp_hf  # noqa: E402

EXAMPLE = HERE.parents[1] / "examples" / "python" / "train_hf_llama.py"
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
SMALL = dict(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
             num_attention_heads=2, num_key_value_heads=1, attn_implementation="sdpa")
CASES = 12  # the check() and check_grpo() calls in hf_worker.main


def _torchrun(torchrun, procs: int, *args: str) -> str:
    result = subprocess.run([*torchrun, "--standalone", f"--nproc_per_node={procs}", *args],
                            env=ENV, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-8000:]
    return result.stdout


@pytest.mark.parametrize("cp", [2, 3, 4])
def test_hf_models_match_one_process(torchrun, cp):
    out = _torchrun(torchrun, cp, str(HERE / "hf_worker.py"))
    assert out.count("all checks passed") == cp, out
    assert out.count("relative error") == CASES, out


# Compiled: 5 steps, as 20 take ~280 s of CI with Inductor's caches off (docs/python.md).
# "auto" attention is cpkit's own on the CPU, compiled too (its 1.7e-5 final-weight gap was
# AdamW's eps 1e-8 turning rounding on ~0 gradients into lr-sized steps: the example now
# uses eps 1e-6, and the gap is 2.8e-6).
@pytest.mark.parametrize("layout,loss,compiled,steps,attention", [
    ("balanced", "fused", False, 20, "auto"), ("contiguous", "logits", False, 20, "auto"),
    ("head_tail", "fused", True, 5, "auto")])
def test_hf_llama_example_trains_like_one_process(torchrun, layout, loss, compiled, steps,
                                                  attention):
    out = _torchrun(torchrun, 4, str(EXAMPLE), "--steps", str(steps), "--layout", layout,
                    "--loss", loss, "--attention", attention,
                    *(["--compile"] if compiled else []))
    assert "MATCH (tolerance 1e-5)" in out and "MISMATCH" not in out, out
    assert out.count("step ") == steps, out


def _llama():
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**SMALL))


def _flat(lengths=(3, 5)) -> dict:
    features = [{"input_ids": list(range(1, n + 1))} for n in lengths]
    return transformers.DataCollatorWithFlattening()(features, return_tensors="pt")


def test_one_rank_equals_hf(world1):
    """CP = 1 through the integration is HF's own loss (the torchrun test covers CP > 1)."""
    reference, batch = _llama(), _flat((4, 1, 6))
    expected = reference(**batch, use_cache=False).loss
    model = cp_hf.apply(_llama(), world1)
    got = model(**cp_hf.shard_batch(batch, world1, layout="balanced")).loss
    assert torch.allclose(got, expected, rtol=1e-6, atol=0), (float(got), float(expected))


def _raises(match: str, call, *args, **kwargs) -> None:
    with pytest.raises(cpkit.CPError, match=match):
        call(*args, **kwargs)


def test_bad_models_are_named():
    _raises("argument 'model': must be a transformers PreTrainedModel, got Linear",
            cp_hf.apply, torch.nn.Linear(2, 2), None)
    base = transformers.LlamaModel(transformers.LlamaConfig(**SMALL))
    _raises("argument 'model': LlamaModel is not a causal LM with a linear head",
            cp_hf.apply, base, None)

    class OwnAttention(transformers.LlamaForCausalLM):
        _supports_attention_backend = False

    _raises("argument 'model': OwnAttention does not route its attention through",
            cp_hf.apply, OwnAttention(transformers.LlamaConfig(**SMALL)), None)
    _raises("argument 'loss': must be one of fused, logits, got \"mean\"",
            cp_hf.apply, _llama(), None, loss="mean")
    _raises("argument 'attention': must be one of auto, cpkit, varlen, got \"flash\"",
            cp_hf.apply, _llama(), None, attention="flash")


def test_soft_capped_attention_is_applied_or_named(world1):
    """Gemma2 soft-caps attention logits (queries scaled so the cap of 0.5 bites): cpkit's own
    attention applies it (CP 1 equals HF's eager model, loss and gradients); the gathering
    backends do not, and say so instead of computing another model."""
    config = transformers.Gemma2Config(**{**SMALL, "attn_implementation": "eager"}, head_dim=8,
                                       attn_logit_softcapping=0.5)
    torch.manual_seed(0)
    reference, batch = transformers.Gemma2ForCausalLM(config), _flat((4, 1, 6))
    with torch.no_grad():
        for layer in reference.model.layers:
            layer.self_attn.q_proj.weight.mul_(40.0)
    model = cp_hf.apply(copy.deepcopy(reference), world1, attention="cpkit")
    expected = reference(**batch, use_cache=False).loss
    expected.backward()
    got = model(**cp_hf.shard_batch(batch, world1)).loss
    got.backward()
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=0)
    for (name, a), b in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-6, msg=name)
    uncapped = transformers.Gemma2Config(**{**SMALL, "attn_implementation": "eager"}, head_dim=8,
                                         attn_logit_softcapping=None)
    other = transformers.Gemma2ForCausalLM(uncapped)
    other.load_state_dict(reference.state_dict())
    other(**batch, use_cache=False).loss.backward()  # the cap changes the queries' gradient
    q_grad = [m.model.layers[0].self_attn.q_proj.weight.grad for m in (other, reference)]
    assert not torch.allclose(q_grad[0], q_grad[1], rtol=0.1, atol=0)
    varlen = cp_hf.apply(copy.deepcopy(reference), world1, attention="varlen")
    _raises("argument 'model': passes 'softcap' to its attention, which the \"varlen\" backend",
            varlen, **cp_hf.shard_batch(_flat(), world1))


def test_bad_calls_are_named(world1):
    model = cp_hf.apply(_llama(), world1)
    batch = _flat()
    _raises("argument 'cpkit_shard': is missing", model, **batch)
    shard = cp_hf.shard_batch(batch, world1)
    _raises("argument 'attention_mask': goes to shard_batch", model, **shard,
            attention_mask=torch.ones_like(shard["input_ids"]))
    varlen = cp_hf.apply(_llama(), world1, attention="varlen")
    rows = {"input_ids": torch.ones(2, 4, dtype=torch.long),
            "labels": torch.ones(2, 4, dtype=torch.long)}
    _raises("argument 'attention': \"varlen\" needs packed documents",
            varlen, **cp_hf.shard_batch(rows, world1))
    _raises("argument 'old_logprobs': is missing: a policy loss needs", model,
            **cp_hf.shard_batch({**batch, "advantages": torch.zeros(batch["labels"].shape)},
                                world1), policy={"kind": "ppo"})


def test_bad_batches_are_named():
    ids = torch.ones(1, 6, dtype=torch.long)
    plain = {"input_ids": ids, "labels": ids}
    _raises("argument 'batch': packed=True needs documents: seq_lens, or position_ids",
            cp_hf.shard_batch, plain, None, packed=True)
    _raises("argument 'batch': packed=True needs documents", cp_hf.shard_batch,
            {**plain, "position_ids": torch.arange(6).view(1, 6)}, None, packed=True)
    _raises("argument 'labels': is missing", cp_hf.shard_batch, {"input_ids": ids}, None)
    _raises("argument 'pixel_values': is not a field shard_batch takes", cp_hf.shard_batch,
            {**plain, "pixel_values": torch.zeros(1, 3)}, None)
    _raises("argument 'labels': must be a tensor, got list", cp_hf.shard_batch,
            {"input_ids": ids, "labels": [1] * 6}, None)
    _raises(re.escape("argument 'advantages': must be [B, S] like labels [1, 6], got [1, 5]"),
            cp_hf.shard_batch, {**plain, "advantages": torch.zeros(1, 5)}, None)
    flat = _flat()
    _raises("argument 'attention_mask': packed documents take no attention_mask",
            cp_hf.shard_batch, {**flat, "attention_mask": torch.ones_like(flat["input_ids"])},
            None)
    two_rows = {k: flat[k].repeat(2, 1) for k in ("input_ids", "labels", "position_ids")}
    _raises("argument 'position_ids': position-id packing needs one packed row, got 2 rows",
            cp_hf.shard_batch, two_rows, None)
    skipped = {**flat, "position_ids": torch.tensor([[0, 1, 2, 0, 1, 3, 4, 5]])}
    _raises("argument 'position_ids': token 5 has position 3 after 1", cp_hf.shard_batch,
            skipped, None)
    late = {**flat, "position_ids": torch.tensor([[1, 2, 3, 0, 1, 2, 3, 4]])}
    _raises("argument 'position_ids': token 0 has position 1: position-id packing starts",
            cp_hf.shard_batch, late, None)
