"""Per-token log-probabilities of a rollout under context parallelism, and one GRPO step from
them, checked against the same step in one process.

    torchrun --standalone --nproc_per_node=4 examples/python/grpo_step.py \
        [--layout contiguous|head_tail] [--temperature 0.8]

A tiny causal policy samples a group of responses to one prompt in one process (the rollout).
Each rank then holds its shard of the sequences (cpkit.prepare_cp_inputs; attention through
cpkit.cp_attention, only the keys each rank's queries need moving) and computes, with
cpkit.token_logprobs, the log-probability of every sampled token under the policy and the
sampler's temperature: the LM head is fused in (no [B, S, V] logits), the target of a shard's
last token comes from the next rank, and bf16 heads keep fp32 logits. Those old
log-probabilities (gathered in global order by cpkit.restore_order) are compared with
F.log_softmax in fp64 on the whole batch. The GRPO loss (group-normalised rewards, clipped
ratio, token mean over every rank) is then cpkit.policy_loss under CP and the same loss in
torch in a single process; each takes one SGD step, rank 0 prints both and every rank exits 1
if the updated weights differ.
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

VOCAB, HIDDEN, HEADS, PROMPT, SEQ, GROUP = 50, 32, 2, 6, 38, 4  # SEQ: no CP divides it
CLIP = 0.2


class Policy(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, HIDDEN)
        self.qkv = torch.nn.Linear(HIDDEN, 3 * HIDDEN, bias=False)
        self.out = torch.nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.head = torch.nn.Linear(HIDDEN, VOCAB, bias=False)

    def hidden(self, ids: torch.Tensor, plan, mesh) -> torch.Tensor:
        """ids [B, L] -> hidden states [B, L, H]. ``plan`` None: whole rows, causal attention;
        else this rank's shard through cpkit.cp_attention with the shard's attention plan
        (each rank receives only the keys its queries may see; padding sees nothing)."""
        x = self.embed(ids)
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        heads = lambda t: t.view(*t.shape[:2], HEADS, -1)  # noqa: E731  [B, L, heads, D]
        if plan is None:
            attended = F.scaled_dot_product_attention(
                *(heads(t).transpose(1, 2) for t in (q, k, v)), is_causal=True).transpose(1, 2)
        else:
            attended = cpkit.cp_attention(heads(q), heads(k), heads(v), plan, mesh).out
        return x + self.out(attended.reshape(*x.shape))


@torch.no_grad()
def rollout(policy: Policy, temperature: float) -> torch.Tensor:
    """GROUP responses to one prompt, sampled token by token at `temperature`: [GROUP, SEQ]."""
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, VOCAB, (1, PROMPT), generator=g).repeat(GROUP, 1)
    while ids.shape[1] < SEQ:
        n = ids.shape[1]
        h = policy.hidden(ids, None, None)
        probs = F.softmax(policy.head(h[:, -1]) / temperature, dim=-1)
        ids = torch.cat([ids, torch.multinomial(probs, 1, generator=g)], dim=1)
    return ids


def advantages_of(ids: torch.Tensor) -> torch.Tensor:
    """GRPO: a reward per response (here the share of even tokens), normalised in the group."""
    reward = (ids[:, PROMPT:] % 2 == 0).float().mean(1)
    return ((reward - reward.mean()) / (reward.std() + 1e-6)).unsqueeze(1)  # [GROUP, 1]


def grpo_loss(logprobs, old, mask, advantages, total: int) -> torch.Tensor:
    """The one-process clipped-ratio policy loss: a mean over the `total` response tokens."""
    ratio = torch.exp(logprobs - old)
    clipped = torch.clamp(ratio, 1 - CLIP, 1 + CLIP)
    return -(torch.minimum(ratio * advantages, clipped * advantages) * mask).sum() / total


def cp_step(policy: Policy, ids: torch.Tensor, mesh, layout: str, temperature: float):
    """Old log-probabilities (global order, fp32) and the CP loss after its backward."""
    labels = ids.clone()
    labels[:, :PROMPT] = -100  # the prompt is not scored: its tokens are nobody's target
    sharder = cpkit.prepare_cp_inputs({"input_ids": ids, "labels": labels}, 1, mesh=mesh,
                                      layout=layout)
    s = sharder.local(0)
    h = policy.hidden(s["input_ids"], sharder.attention_plan(0), mesh)
    with torch.no_grad():  # the rollout's log-probabilities (the "old policy")
        old = cpkit.token_logprobs(h, policy.head.weight, s["labels"], s["valid"], mesh,
                                   temperature=temperature, layout=s["layout"])
    # The GRPO loss in one op through the head: the clipped ratio, its token mean counted
    # over every rank, the gradient formed in the logits pass. Each response's advantage
    # holds at each of its positions.
    advantages = advantages_of(ids).expand_as(s["labels"]).contiguous()
    out = cpkit.policy_loss(h, policy.head.weight, s["labels"], s["valid"], advantages,
                            old.logprobs, mesh, kind="ppo", eps_low=CLIP, eps_high=CLIP,
                            aggregation="token_mean", temperature=temperature,
                            entropy=True, layout=s["layout"])  # entropy: logged below
    out.loss.backward()
    for p in policy.parameters():  # each rank's loss is CP times its share: average, as FSDP
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()
    global_old = cpkit.restore_order(old.logprobs, s["layout"], mesh)[:, :SEQ]
    total_loss = out.loss.detach() / dist.get_world_size()
    dist.all_reduce(total_loss)
    entropy = out.entropy.sum()
    dist.all_reduce(entropy)
    total = int(labels[:, 1:].ne(-100).sum())
    return global_old, float(total_loss), float(entropy) / total


def one_process_step(policy: Policy, ids: torch.Tensor, temperature: float):
    """The same with F.log_softmax on the whole batch: fp64 old log-probabilities (to check
    cpkit's), then the loss in the policy's fp32."""
    n = ids.shape[1]
    h = policy.hidden(ids, None, None)
    logits = h[:, :-1] @ policy.head.weight.T / temperature
    target = ids[:, 1:].unsqueeze(-1)
    mask = torch.zeros(GROUP, n)
    mask[:, PROMPT - 1:-1] = 1  # position t predicts token t + 1: the response tokens
    with torch.no_grad():
        old64 = torch.zeros(GROUP, n, dtype=torch.float64)
        old64[:, :-1] = F.log_softmax(logits.double(), -1).gather(-1, target).squeeze(-1)
        old64 *= mask
    lp = torch.zeros(GROUP, n)
    lp[:, :-1] = F.log_softmax(logits, -1).gather(-1, target).squeeze(-1)
    loss = grpo_loss(lp * mask, old64.float(), mask, advantages_of(ids), int(mask.sum()))
    loss.backward()
    return old64, float(loss.detach())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layout", default="contiguous",
                        choices=("contiguous", "head_tail"))
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--lr", type=float, default=0.5)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    cp, rank = dist.get_world_size(), dist.get_rank()
    mesh = init_device_mesh("cpu", (cp,), mesh_dim_names=("cp",))["cp"]
    torch.manual_seed(0)
    policy, reference = Policy(), Policy()
    reference.load_state_dict(policy.state_dict())
    ids = rollout(reference, args.temperature)
    before = [p.detach().clone() for p in policy.parameters()]
    old, cp_loss, entropy = cp_step(policy, ids, mesh, args.layout, args.temperature)
    old64, one_loss = one_process_step(reference, ids, args.temperature)
    for model in (policy, reference):
        torch.optim.SGD(model.parameters(), lr=args.lr).step()
    logprob_error = float((old.double() - old64).abs().max())
    weights = max(float((a - b).abs().max()) for a, b in
                  zip(policy.parameters(), reference.parameters()))
    update = max(float((a - b).abs().max()) for a, b in zip(policy.parameters(), before))
    # The step must move the weights (the policy gradient is not zero) and move them alike.
    ok = (logprob_error <= 1e-5 and abs(cp_loss - one_loss) <= 1e-6 and weights <= 1e-5
          and update > 1e-4)
    if rank == 0:
        print(f"CP={cp} ({args.layout}): {GROUP} responses of {SEQ - PROMPT} tokens, mean "
              f"entropy {entropy:.4f}\n"
              f"old log-probabilities: max |cpkit - fp64 log_softmax| = {logprob_error:.2e}\n"
              f"GRPO loss: CP {cp_loss:.8f}, one process {one_loss:.8f}\n"
              f"one SGD step moved the weights by up to {update:.2e}; max difference from one "
              f"process {weights:.2e}: "
              f"{'MATCH' if ok else 'MISMATCH'} (tolerance 1e-5)", flush=True)
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    code = main()
    # Leave without Python's finalisation (docs/python.md, "Ending a Gloo job").
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
