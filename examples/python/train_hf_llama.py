"""A Hugging Face Llama trained with FSDP2 on a 2-D (data x context) mesh through cpkit, then
checked against the same model trained in one process with HF's own attention and loss.

    torchrun --standalone --nproc_per_node=4 examples/python/train_hf_llama.py --steps 20 \
        [--layout contiguous|head_tail|balanced] [--loss fused|logits] [--compile]

Ranks form a (dp 2, cp 2) mesh. Each data replica draws its own packed batch from HF's
DataCollatorWithFlattening (documents marked by position_ids restarting at 0); the two CP
ranks of a replica each hold a shard of it. The cpkit part is three lines:

    cp_hf.apply(model, mesh["cp"])                               # attention + loss
    shard = cp_hf.shard_batch(batch, mesh["cp"], layout=...)     # this rank's inputs
    model(**shard).loss.backward()

FSDP2 shards the parameters over all four ranks (the flattened dp x cp dims) and averages
the gradients over them: cpkit's loss scaling makes that average the gradient of the mean of
the replicas' single-device losses. Rank 0 runs the one-process reference (a tiny config, no
download) on both replicas' whole batches and prints both losses step by step; every rank
exits 1 if losses or final weights differ by more than 1e-5.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from transformers import DataCollatorWithFlattening, LlamaConfig, LlamaForCausalLM

from cpkit.integrations import transformers as cp_hf

DP, CP, VOCAB = 2, 2, 96
CONFIG = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
              attn_implementation="sdpa")


def replica_batch(step: int, replica: int) -> dict:
    """Documents of random lengths (no CP divides them all) in a learnable language: each token
    follows from the one before (x -> 7x + 5 mod V) from a random start; flattened by HF."""
    g = torch.Generator().manual_seed(10_000 * step + replica)
    features = []
    for _ in range(int(torch.randint(3, 7, (1,), generator=g))):
        length = int(torch.randint(1, 40, (1,), generator=g))
        ids = [int(torch.randint(0, VOCAB, (1,), generator=g))]
        for _ in range(length - 1):
            ids.append((7 * ids[-1] + 5) % VOCAB)
        features.append({"input_ids": ids})
    return DataCollatorWithFlattening()(features, return_tensors="pt")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--layout", default="balanced",
                        choices=("contiguous", "head_tail", "balanced"))
    parser.add_argument("--loss", default="fused", choices=("fused", "logits"))
    parser.add_argument("--compile", action="store_true", help="torch.compile the CP model")
    parser.add_argument("--attention", default="auto", choices=("auto", "cpkit", "varlen"),
                        help="cpkit.integrations.transformers.apply's attention backend "
                             "(auto: cpkit's own; varlen for float16 models on CUDA)")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    if dist.get_world_size() != DP * CP:
        raise SystemExit(f"run with --nproc_per_node={DP * CP}")
    mesh = init_device_mesh("cpu", (DP, CP), mesh_dim_names=("dp", "cp"))
    replica, rank = mesh["dp"].get_local_rank(), dist.get_rank()
    torch.manual_seed(0)
    reference = LlamaForCausalLM(LlamaConfig(**CONFIG))
    model = copy.deepcopy(reference)

    cp_hf.apply(model, mesh["cp"], loss=args.loss, attention=args.attention)
    everyone = mesh["dp", "cp"]._flatten("dp_cp")  # FSDP over every rank
    for layer in model.model.layers:
        fully_shard(layer, mesh=everyone)
    fully_shard(model, mesh=everyone)
    # Compiled, both sides: Inductor's fused kernels round differently from eager ones, and
    # AdamW turns that into weight differences above 1e-5 on entries whose gradient is ~0.
    step_model, one_model = ((torch.compile(model), torch.compile(reference)) if args.compile
                             else (model, reference))

    # AdamW divides each entry's gradient by its running magnitude plus eps: with the default
    # eps 1e-8 an entry whose gradient stays ~1e-8 takes lr-sized steps whose sign is float
    # rounding (one such entry of 8192 ended 1.3e-5 apart after 20 steps while every gradient
    # agreed to ~1e-7). eps 1e-6 keeps those steps small on both sides, so the weights compare
    # what CP changes, not AdamW's amplification of rounding.
    optimizers = [torch.optim.AdamW(m.parameters(), lr=args.lr, eps=1e-6)
                  for m in (model, reference)]
    worst = 0.0
    for step in range(args.steps):
        batches = [replica_batch(step, r) for r in range(DP)]
        shard = cp_hf.shard_batch(batches[replica], mesh["cp"], layout=args.layout)
        loss = step_model(**shard).loss
        loss.backward()
        optimizers[0].step()
        optimizers[0].zero_grad()
        mean = loss.detach().clone()
        dist.all_reduce(mean)  # each replica's CP shares sum to CP x its mean
        cp_loss = float(mean) / (DP * CP)
        if rank == 0:  # the one-process reference: HF's attention and loss, whole batches
            one = sum(one_model(**b, use_cache=False).loss for b in batches) / DP
            one.backward()
            optimizers[1].step()
            optimizers[1].zero_grad()
            one_loss = float(one.detach())
            worst = max(worst, abs(cp_loss - one_loss) / abs(one_loss), key=_nan_high)
            print(f"step {step:2d}: dp {DP} x cp {CP} ({args.layout}, {args.loss}) loss "
                  f"{cp_loss:.6f}   one process {one_loss:.6f}", flush=True)
    weights = 0.0
    for a, b in zip(model.parameters(), reference.parameters()):
        full = a.full_tensor()  # a collective: every rank takes part
        if rank == 0:
            weights = max(weights, float((full - b.detach()).abs().max()), key=_nan_high)
    ok = torch.tensor([worst <= 1e-5 and weights <= 1e-5], dtype=torch.int32)  # NaN fails
    dist.broadcast(ok, 0)
    if rank == 0:
        print(f"max relative loss difference {worst:.2e}, max final weight difference "
              f"{weights:.2e}: {'MATCH' if ok.item() else 'MISMATCH'} (tolerance 1e-5)",
              flush=True)
    dist.destroy_process_group()
    return 0 if ok.item() else 1


def _nan_high(x: float) -> float:
    """max() key under which NaN wins, so a NaN difference cannot hide behind a finite one."""
    return float("inf") if x != x else x


if __name__ == "__main__":
    code = main()
    # Leave without Python's finalisation: torch 2.11's Gloo groups have no shutdown, their
    # worker threads outlive destroy_process_group, and one that frees a collective's tensor
    # while Python finalises aborts a run that passed (docs/python.md, "Ending a Gloo job").
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
