"""A tiny causal LM trained with context parallelism on packed documents, then checked
against the same model trained in one process on the unsharded batches.

    torchrun --standalone --nproc_per_node=4 examples/python/train_tiny_lm.py --steps 30 \
        [--layout contiguous|head_tail|balanced]

Each rank holds its shard of every packed row (cpkit.prepare_packed_cp_inputs): a contiguous
block, or under a load-balanced layout pieces of documents chosen so every rank does the same
causal attention work. The attention layer is cpkit.cp_attention: each rank receives only the
keys and values its queries may see (the shard's attention plan) and returns their gradients
to their owners, on CPU and GPU tensors alike. The one-process run
writes the document-causal mask out over the whole row. The LM head's logits go to
cpkit.shifted_cp_loss with the shard's layout, whose CP / N scaling makes the average of the
ranks' gradients (all-reduce / CP, as FSDP does) the single-device gradient. Rank 0 prints both
runs' losses step by step; every rank exits 1 if they differ.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh

import cpkit

VOCAB, HIDDEN, HEADS, ROW = 64, 32, 2, 67  # ROW tokens per packed row: no CP divides it


class TinyLM(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, HIDDEN)
        self.qkv = torch.nn.Linear(HIDDEN, 3 * HIDDEN, bias=False)
        self.out = torch.nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.head = torch.nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, ids: torch.Tensor, shard: dict, mesh) -> torch.Tensor:
        """ids [L] of this rank's shard -> logits [1, L, V]. mesh None: the whole row."""
        x = self.embed(ids)
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        if mesh is None:
            attended = self.masked(q, k, v, shard)
        else:  # only the keys this rank's queries may see move
            heads = lambda t: t.view(1, len(ids), HEADS, -1)  # noqa: E731
            out = cpkit.cp_attention(heads(q), heads(k), heads(v), shard["attention_plan"], mesh)
            attended = out.out.reshape(len(ids), HIDDEN)
        return self.head(x + self.out(attended)).unsqueeze(0)

    def masked(self, q, k, v, whole) -> torch.Tensor:
        """Attention over the whole row with the document-causal mask written out."""
        pos, doc = whole["position_ids"].flatten(), whole["document_ids"].flatten()
        pad = whole["padding"].flatten()
        allowed = ((doc[:, None] > 0) & (doc[:, None] == doc[None, :])
                   & (pos[None, :] <= pos[:, None]) & ~pad[None, :])
        seen = allowed.any(1)
        # Queries with no key (slot padding of empty documents, the row tail) get zeros, as
        # cp_attention gives them; their outputs only reach ignored labels.
        allowed[~seen, torch.arange(len(pos))[~seen]] = True
        heads = lambda t: t.view(t.shape[0], HEADS, -1).transpose(0, 1)  # noqa: E731
        attended = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), attn_mask=allowed)
        return attended.transpose(0, 1).reshape(len(pos), HIDDEN) * seen[:, None]


def packed_batch(step: int) -> dict:
    """One packed row of documents (some empty, some with slot padding) and a row tail."""
    g = torch.Generator().manual_seed(1000 + step)
    lens, slots, used = [], [], 0
    while True:
        length = int(torch.randint(0, 25, (1,), generator=g))
        slot = length + int(torch.randint(0, 3, (1,), generator=g))
        if used + slot > ROW - 2:
            break
        lens.append(length)
        slots.append(slot)
        used += slot
    # A learnable language: each token follows from the one before (x -> 5x + 3 mod V) from
    # a random start per row; labels are the ids themselves (HF style, unshifted).
    ids = torch.empty(ROW, dtype=torch.long)
    ids[0] = int(torch.randint(0, VOCAB, (1,), generator=g))
    for t in range(1, ROW):
        ids[t] = (5 * ids[t - 1] + 3) % VOCAB
    return {"input_ids": ids.view(1, ROW), "labels": ids.view(1, ROW).clone(),
            "seq_lens": torch.tensor([lens]), "seq_lens_padded": torch.tensor([slots]),
            "qkv_format": "thd"}


def cp_step(model: TinyLM, batch: dict, mesh, cp: int, layout: str) -> float:
    sharder = cpkit.prepare_packed_cp_inputs(batch, 1, mesh=mesh, layout=layout)
    shard = {**sharder.local(0), "attention_plan": sharder.attention_plan(0)}
    logits = model(shard["input_ids"].flatten(), shard, mesh)
    loss = cpkit.shifted_cp_loss(logits, shard["labels"], shard["valid"], mesh,
                                 layout=shard["layout"])
    loss.backward()
    for p in model.parameters():  # the gradient average FSDP / DDP does over the CP group
        dist.all_reduce(p.grad)
        p.grad /= cp
    mean = loss.detach().clone()
    dist.all_reduce(mean)
    return float(mean) / cp


def single_process_step(model: TinyLM, batch: dict) -> float:
    """The same model on the unsharded row, plain PyTorch loss (HF-shifted, mean)."""
    whole = cpkit.prepare_packed_cp_inputs(batch, 1).local(0)
    logits = model(whole["input_ids"].flatten(), whole, None)[0]
    labels = torch.where(whole["valid"], whole["labels"].flatten(), -100)
    loss = F.cross_entropy(logits[:-1], labels[1:], ignore_index=-100)
    loss.backward()
    return float(loss.detach())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--layout", default="contiguous",
                        choices=("contiguous", "head_tail", "balanced"))
    args = parser.parse_args()
    dist.init_process_group("gloo")
    cp, rank = dist.get_world_size(), dist.get_rank()
    mesh = init_device_mesh("cpu", (cp,), mesh_dim_names=("cp",))["cp"]
    torch.manual_seed(0)
    sharded = TinyLM()
    reference = TinyLM()
    reference.load_state_dict(sharded.state_dict())
    optimizers = [torch.optim.SGD(m.parameters(), lr=args.lr) for m in (sharded, reference)]
    worst = 0.0
    for step in range(args.steps):
        batch = packed_batch(step)
        for optimizer in optimizers:
            optimizer.zero_grad()
        cp_loss = cp_step(sharded, batch, mesh, cp, args.layout)
        one_loss = single_process_step(reference, batch)
        for optimizer in optimizers:
            optimizer.step()
        worst = max(worst, abs(cp_loss - one_loss) / max(1.0, abs(one_loss)))
        if rank == 0:
            print(f"step {step:2d}: CP={cp} ({args.layout}) loss {cp_loss:.6f}   one process "
                  f"{one_loss:.6f}", flush=True)
    weights = max(float((a - b).abs().max()) for a, b in
                  zip(sharded.parameters(), reference.parameters()))
    ok = worst <= 1e-5 and weights <= 1e-5  # FP32; NaN fails
    if rank == 0:
        print(f"max relative loss difference {worst:.2e}, max final weight difference "
              f"{weights:.2e}: {'MATCH' if ok else 'MISMATCH'} (tolerance 1e-5)", flush=True)
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    code = main()
    # Leave without Python's finalisation: torch 2.11's Gloo groups have no shutdown, their
    # worker threads outlive destroy_process_group, and one that frees a collective's tensor
    # while Python finalises aborts a run that passed (docs/python.md, "Ending a Gloo job").
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
