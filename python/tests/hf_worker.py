"""One torchrun rank of the transformers-integration checks (test_hf_integration.py).

Every case builds a tiny HF causal LM (config only) and an identical copy: the copy runs in
this process on the whole batch with HF's own attention ("sdpa") and loss; the model made
context-parallel by cpkit.integrations.transformers runs on this rank's shard. Each rank's
loss averaged over the CP group, and its gradients averaged the same way (what FSDP does),
must equal the single-process loss and gradients; the same for one GRPO update through the
policy loss. Prints "all checks passed" at the end."""

from __future__ import annotations

import copy
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from transformers import (DataCollatorWithFlattening, LlamaConfig, LlamaForCausalLM,
                          MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM)

from cpkit.integrations import _hf_attention
from cpkit.integrations import transformers as cp_hf
import torchrun_exit

VOCAB = 64
SMALL = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
             attn_implementation="sdpa")


def family(name: str):
    """A tiny model of each tested family; the windowed ones with a window shorter than
    their documents so the window changes the result."""
    if name == "llama":
        return LlamaForCausalLM(LlamaConfig(**SMALL))
    if name == "qwen2":  # layer 0 full attention, layer 1 a 3-token sliding window
        return Qwen2ForCausalLM(Qwen2Config(**SMALL, use_sliding_window=True, sliding_window=3,
                                            max_window_layers=1))
    if name == "mistral":
        return MistralForCausalLM(MistralConfig(**SMALL, sliding_window=4))
    raise AssertionError(name)


def documents(seed: int) -> list[dict]:
    """Documents of lengths no CP divides, one of a single token."""
    g = torch.Generator().manual_seed(seed)
    lengths = [11, 1, 7, 16, 5]
    return [{"input_ids": torch.randint(0, VOCAB, (n,), generator=g).tolist()} for n in lengths]


def padded_rows(seed: int) -> dict:
    """A BSHD batch of two rows: the first right-padded, the second left-padded (HF's
    attention_mask). The left-padded row's first real token gets label -100: HF predicts it
    from a padding token, whose output neither side defines the same way."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (2, 21), generator=g)
    mask = torch.ones(2, 21, dtype=torch.long)
    mask[0, 17:] = 0
    mask[1, :6] = 0
    labels = torch.where(mask.bool(), ids, -100)
    labels[1, 6] = -100
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def reference_varlen(q, k, v, cu_q, cu_k, max_q, max_k, *, scale=None, window_size=(-1, -1)):
    """A plain varlen attention (segments of cu_q / cu_k, causal bottom-right, GQA) standing
    in for the CUDA kernel, so the integration's offsets are checked on the CPU."""
    out = torch.zeros_like(q)
    groups = q.shape[1] // k.shape[1]
    for i in range(len(cu_q) - 1):
        q0, q1, k0, k1 = int(cu_q[i]), int(cu_q[i + 1]), int(cu_k[i]), int(cu_k[i + 1])
        if q1 == q0 or k1 == k0:
            continue
        rows = torch.arange(q1 - q0)[:, None] + (k1 - k0) - (q1 - q0)  # bottom-right
        cols = torch.arange(k1 - k0)[None, :]
        allowed = cols <= rows
        if window_size[0] >= 0:
            allowed &= cols >= rows - window_size[0]
        keys = k[k0:k1].repeat_interleave(groups, 1).transpose(0, 1)
        values = v[k0:k1].repeat_interleave(groups, 1).transpose(0, 1)
        attended = torch.nn.functional.scaled_dot_product_attention(
            q[q0:q1].transpose(0, 1), keys, values, attn_mask=allowed, scale=scale)
        out[q0:q1] = attended.transpose(0, 1)
    return out


def check(case: str, mesh, model_name: str, batch: dict, layout: str, loss: str,
          attention: str = "auto") -> None:
    cp = dist.get_world_size()
    torch.manual_seed(0)
    reference = family(model_name)
    model = copy.deepcopy(reference)
    loss_one = reference(**batch, use_cache=False).loss
    loss_one.backward()
    expected = float(loss_one.detach())
    cp_hf.apply(model, mesh, loss=loss, attention=attention)
    out = model(**cp_hf.shard_batch(batch, mesh, layout=layout))
    out.loss.backward()
    got = out.loss.detach().clone()
    dist.all_reduce(got)
    errors = [abs(float(got) / cp - expected) / abs(expected)]
    for (name, a), b in zip(model.named_parameters(), reference.parameters()):
        dist.all_reduce(a.grad)
        scale = float(b.grad.abs().max()) + 1e-12
        errors.append(float((a.grad / cp - b.grad).abs().max()) / scale)
    bad = [e for e in errors if not e <= 2e-5]  # NaN fails
    assert not bad, f"{case}: relative errors {bad[:4]} (loss {errors[0]:.3e})"
    worst = max(errors)
    assert (loss == "fused") == (out.logits is None), case
    if dist.get_rank() == 0:
        print(f"{case}: relative error {worst:.2e}", flush=True)


def grpo_batch(model, seed: int) -> dict:
    """A group of 4 responses (6 prompt tokens, 15 response tokens), group-normalised rewards
    as each response token's advantage, and old log-probabilities near the model's own (the
    policy moved a little since the rollout): [B, S] like labels."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (1, 6), generator=g).repeat(4, 1)
    ids = torch.cat([ids, torch.randint(0, VOCAB, (4, 15), generator=g)], 1)
    labels = ids.clone()
    labels[:, :6] = -100
    reward = (ids[:, 6:] % 3 == 0).float().mean(1)
    advantages = ((reward - reward.mean()) / (reward.std() + 1e-6))[:, None].expand(4, 21)
    with torch.no_grad():
        lp = torch.log_softmax(model(input_ids=ids, use_cache=False).logits.double(), -1)
    old = torch.zeros(4, 21)
    old[:, 1:] = lp[:, :-1].gather(-1, ids[:, 1:, None])[..., 0].float()
    old += 0.3 * torch.randn(4, 21, generator=g)
    return {"input_ids": ids, "labels": labels, "advantages": advantages.contiguous(),
            "old_logprobs": old}


def grpo_loss(model, batch: dict) -> torch.Tensor:
    """The GRPO objective in one process from HF's logits: DAPO's clip (0.2, 0.28), token mean
    over the response tokens; token t's log-probability predicted at t - 1."""
    logits = model(input_ids=batch["input_ids"], use_cache=False).logits
    lp = torch.log_softmax(logits[:, :-1].float(), -1).gather(
        -1, batch["input_ids"][:, 1:, None])[..., 0]
    mask = batch["labels"][:, 1:] != -100
    a, ratio = batch["advantages"][:, 1:], torch.exp(lp - batch["old_logprobs"][:, 1:])
    pg = torch.maximum(-a * ratio, -a * ratio.clamp(0.8, 1.28))
    return pg[mask].mean()


def check_grpo(case: str, mesh, layout: str, attention: str) -> None:
    """One GRPO update under CP equals it in one process: the policy loss through
    model(**shard, policy=...) against the objective written from HF's logits."""
    cp = dist.get_world_size()
    torch.manual_seed(0)
    reference = family("llama")
    model = copy.deepcopy(reference)
    batch = grpo_batch(reference, 5)
    loss_one = grpo_loss(reference, batch)
    loss_one.backward()
    cp_hf.apply(model, mesh, attention=attention)
    out = model(**cp_hf.shard_batch(batch, mesh, layout=layout),
                policy={"kind": "ppo", "eps_low": 0.2, "eps_high": 0.28})
    out.loss.backward()
    got = out.loss.detach().clone()
    dist.all_reduce(got)
    errors = [abs(float(got) / cp - float(loss_one)) / abs(float(loss_one))]
    for a, b in zip(model.parameters(), reference.parameters()):
        dist.all_reduce(a.grad)
        errors.append(float((a.grad / cp - b.grad).abs().max()) / (float(b.grad.abs().max()) + 1e-12))
    bad = [e for e in errors if not e <= 2e-5]  # NaN fails
    assert not bad, f"{case}: relative errors {bad[:4]} (loss {errors[0]:.3e})"
    if dist.get_rank() == 0:
        print(f"{case}: relative error {max(errors):.2e}", flush=True)


def main() -> None:
    dist.init_process_group("gloo")
    cp = dist.get_world_size()
    mesh = init_device_mesh("cpu", (cp,), mesh_dim_names=("cp",))["cp"]
    flat = DataCollatorWithFlattening()(documents(1), return_tensors="pt")
    # cpkit's own attention ("auto" on the CPU: only the needed keys move) on every layout.
    for layout in ("contiguous", "head_tail", "balanced"):
        check(f"llama packed {layout} fused", mesh, "llama", flat, layout, "fused")
    check("qwen2 packed balanced sliding window", mesh, "qwen2", flat, "balanced", "fused")
    check("mistral packed sliding window logits", mesh, "mistral", flat, "contiguous", "logits")
    check("llama BSHD left padding", mesh, "llama", padded_rows(2), "contiguous", "fused")
    check("llama BSHD head_tail logits", mesh, "llama", padded_rows(3), "head_tail", "logits")
    # An RL step: the GRPO policy loss through the integration, DAPO's clip, every layout.
    for layout in ("contiguous", "head_tail"):
        check_grpo(f"llama GRPO step {layout}", mesh, layout, "cpkit")
    _hf_attention.varlen_attn = reference_varlen
    for layout in ("contiguous", "balanced"):
        check(f"llama varlen offsets {layout}", mesh, "llama", flat, layout, "fused", "varlen")
    check("mistral varlen sliding window", mesh, "mistral", flat, "head_tail", "fused", "varlen")
    print(f"rank {dist.get_rank()}/{cp}: all checks passed", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torchrun_exit.run(main)
