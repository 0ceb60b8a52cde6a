#!/usr/bin/env python3
"""The fused LM head against what a Python user would pick instead, in one run
(docs/performance.md, "Fused head against Python contenders").

Forward + backward of the shifted next-token loss from hidden [1, T, H] and the head's weight
[V, H] (float32, gradients for both), each contender in its own process so peak memory is its
own:
- gemms: the three GEMMs alone (logits = h W^T, d hidden = dlogits W, d weight = dlogits^T h)
  into preallocated outputs, the logits written vocab-major ([V, T], the faster layout for
  MKL here): the work every contender must do, the bound to approach;
- gemms_row_major: the same with the logits written [T, V] (what the other contenders do);
- cpkit: cpkit.shifted_cp_linear_loss (one rank, default chunk_rows);
- cpkit_logprobs: cpkit.token_logprobs (default fp32 precision), the loss as minus the mean
  of the per-token log-probabilities (its backward recomputes the logits: four GEMMs);
- cce_compile: cut-cross-entropy's linear_cross_entropy(impl="torch_compile", shift=1);
- cce_per_token: the same with reduction="none" (per-token values, as token_logprobs gives),
  then their mean;
- eager: F.cross_entropy(F.linear(h, W)) on the shifted targets;
- checkpointed: 256-row chunks of linear + cross_entropy under torch.utils.checkpoint.
The GRPO loss (docs/spec.md section 5c: clipped ratio, k3 KL to a reference, token mean) from
the same inputs, with fixed advantages and old / reference log-probabilities:
- cpkit_policy: cpkit.policy_loss (three GEMMs: its gradient formed in the logits pass);
- cpkit_logprobs_policy: cpkit.token_logprobs, then the loss in torch (four GEMMs);
- cce_policy: cut-cross-entropy's per-token values (reduction="none": minus the
  log-probabilities), then the loss in torch;
- eager_policy: log_softmax(F.linear(h, W)) gathered at the targets, then the loss in torch.
Time: median of `--repeats` steps after one untimed step; with `--rounds R` every contender
runs R times (each sweep in a rotated order), its time is the median over rounds and each
ratio the median of the ratios within a round (this host's speed drifts by 10-20 % over
minutes). Memory: the largest over rounds of the peak resident set above the
one after that step (freed memory returned to the OS first, so it counts only what a step
holds at once; inputs and the weight's gradient from the previous step excluded); and
`first_step_peak_mib`, the first step's peak above the resident set before it (what a
trainer sees on its first step: one-time buffers, compilation and the weight's gradient
included).

`--only a,b,...` runs those contenders; `cpkit:N` and `cpkit_policy:N` run the fused op at
`chunk_rows = N` (several chunk sizes in one run).

Usage: <torch venv>/bin/python bench/head_bench.py [--T 2048 --H 512 --V 131072] [--rounds 3]
       [--only NAMES] [--out F]
cut-cross-entropy is an optional bench dependency (pip install cut-cross-entropy==25.1.1).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import pathlib
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

CONTENDERS = ("gemms", "gemms_row_major", "cpkit", "cpkit_logprobs", "cce_compile",
              "cce_per_token", "eager", "checkpointed", "cpkit_policy", "cpkit_logprobs_policy",
              "cce_policy", "eager_policy")
POLICY_CLIP, POLICY_KL = 0.2, 0.05
CHECKPOINT_ROWS = 256


def rss_kib(field: str) -> int:
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def inputs(T: int, H: int, V: int):
    g = torch.Generator().manual_seed(0)
    hidden = (torch.randn(1, T, H, generator=g) / H**0.5).requires_grad_(True)
    weight = torch.randn(V, H, generator=g).requires_grad_(True)
    labels = torch.randint(0, V, (1, T), generator=g)
    return hidden, weight, labels


def policy_inputs(T: int, V: int):
    """Advantages and old / reference log-probabilities at every position but the last."""
    g = torch.Generator().manual_seed(1)
    advantages = torch.randn(1, T, generator=g)
    old = torch.randn(1, T, generator=g) * 0.5 - torch.log(torch.tensor(float(V)))
    ref = torch.randn(1, T, generator=g) * 0.5 - torch.log(torch.tensor(float(V)))
    return advantages, old, ref


def grpo_loss(lp, advantages, old, ref):
    """The GRPO objective written in torch: clipped ratio plus k3 KL, a mean over the tokens."""
    ratio = torch.exp(lp - old)
    pg = torch.maximum(-advantages * ratio,
                       -advantages * ratio.clamp(1 - POLICY_CLIP, 1 + POLICY_CLIP))
    d = ref - lp
    return (pg + POLICY_KL * (torch.exp(d) - d - 1)).mean()


def step_of(name: str, hidden, weight, labels):
    name, _, rows = name.partition(":")  # "cpkit:256": the fused ops at chunk_rows 256
    chunk = {"chunk_rows": int(rows)} if rows else {}
    """One forward + backward of `name`, returning its loss (or None for the bare GEMMs)."""
    T, V = labels.shape[1], weight.shape[0]
    targets = labels[0, 1:]  # position t predicts token t + 1
    if name in ("gemms", "gemms_row_major"):
        h, w = hidden.detach()[0], weight.detach()
        logits = torch.empty(T, V) if name == "gemms_row_major" else torch.empty(V, T).t()
        dh, dw = torch.empty_like(h), torch.empty_like(w)

        def gemms():
            torch.mm(h, w.t(), out=logits)
            torch.mm(logits, w, out=dh)  # d logits stands in for the softmax gradient
            torch.mm(logits.t(), h, out=dw)

        return gemms
    if name == "cpkit":
        import cpkit

        valid = torch.ones(T, dtype=torch.bool)
        loss_of = lambda: cpkit.shifted_cp_linear_loss(  # noqa: E731
            hidden, weight, labels, valid, **chunk)
    elif name == "cpkit_logprobs":
        import cpkit

        valid = torch.ones(T, dtype=torch.bool)
        loss_of = lambda: -cpkit.token_logprobs(  # noqa: E731
            hidden, weight, labels, valid).logprobs.sum() / (T - 1)
    elif name == "cce_compile":
        from cut_cross_entropy import linear_cross_entropy

        loss_of = lambda: linear_cross_entropy(hidden[0], weight, labels[0], shift=1,  # noqa: E731
                                               impl="torch_compile")
    elif name == "cce_per_token":
        from cut_cross_entropy import linear_cross_entropy

        loss_of = lambda: linear_cross_entropy(  # noqa: E731
            hidden[0], weight, labels[0], shift=1, reduction="none", impl="torch_compile").mean()
    elif name == "eager":
        loss_of = lambda: F.cross_entropy(F.linear(hidden[0, :-1], weight), targets)  # noqa: E731
    elif name == "checkpointed":
        def chunk(h, w, y):
            return F.cross_entropy(F.linear(h, w), y, reduction="sum")

        def loss_of():
            rows = hidden[0, :-1]
            total = sum(checkpoint(chunk, rows[b:b + CHECKPOINT_ROWS], weight,
                                   targets[b:b + CHECKPOINT_ROWS], use_reentrant=False)
                        for b in range(0, T - 1, CHECKPOINT_ROWS))
            return total / (T - 1)
    elif name.endswith("_policy"):
        advantages, old, ref = (x[:, :-1] for x in policy_inputs(T, V))
        if name == "cpkit_policy":
            import cpkit

            valid = torch.ones(T, dtype=torch.bool)
            a, o, r = (torch.cat([x, torch.zeros(1, 1)], 1) for x in (advantages, old, ref))
            loss_of = lambda: cpkit.policy_loss(  # noqa: E731
                hidden, weight, labels, valid, a, o, ref_logprobs=r, kl_coef=POLICY_KL,
                eps_low=POLICY_CLIP, eps_high=POLICY_CLIP, **chunk).loss
        else:
            if name == "cpkit_logprobs_policy":
                import cpkit

                valid = torch.ones(T, dtype=torch.bool)
                lp_of = lambda: cpkit.token_logprobs(  # noqa: E731
                    hidden, weight, labels, valid).logprobs[:, :-1]
            elif name == "cce_policy":
                from cut_cross_entropy import linear_cross_entropy

                lp_of = lambda: -linear_cross_entropy(  # noqa: E731
                    hidden[0], weight, labels[0], shift=1, reduction="none",
                    impl="torch_compile").unsqueeze(0)
            else:
                lp_of = lambda: torch.log_softmax(  # noqa: E731
                    F.linear(hidden[0, :-1], weight), -1).gather(
                        -1, targets.unsqueeze(-1)).squeeze(-1).unsqueeze(0)
            loss_of = lambda: grpo_loss(lp_of(), advantages, old, ref)  # noqa: E731
    else:
        raise ValueError(f"unknown contender {name!r}; one of {CONTENDERS}")

    def step():
        hidden.grad = weight.grad = None
        loss = loss_of()
        loss.backward()
        return loss

    return step


def measure(name: str, T: int, H: int, V: int, repeats: int) -> dict:
    hidden, weight, labels = inputs(T, H, V)
    step = step_of(name, hidden, weight, labels)
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    before_first = rss_kib("VmRSS")
    pathlib.Path("/proc/self/clear_refs").write_text("5")
    first = step()  # untimed: compilation, caches
    first_peak = (rss_kib("VmHWM") - before_first) / 1024
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    base = rss_kib("VmRSS")
    pathlib.Path("/proc/self/clear_refs").write_text("5")  # restart VmHWM from here
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        samples.append(time.perf_counter() - start)
    out = {"seconds": statistics.median(samples), "peak_mib": (rss_kib("VmHWM") - base) / 1024,
           "first_step_peak_mib": first_peak}
    if first is not None:
        out["loss"] = float(first.detach())
    return out


def summarise(rounds: dict) -> dict:
    """Per contender, from its list of per-round child results: the median time over rounds,
    the largest peak, the first round's loss; each ratio the median over rounds of the ratio
    within a round (the host's speed drifts between rounds more than between neighbouring
    processes). A contender that failed in any round is reported by its first error."""
    results = {}
    for name, runs in rounds.items():
        errors = [run for run in runs if "error" in run]
        if errors:
            results[name] = errors[0]
            continue
        results[name] = {"seconds": statistics.median(run["seconds"] for run in runs),
                         "seconds_by_round": [run["seconds"] for run in runs],
                         "peak_mib": max(run["peak_mib"] for run in runs),
                         "first_step_peak_mib": max(run["first_step_peak_mib"] for run in runs)}
        if "loss" in runs[0]:
            results[name]["loss"] = runs[0]["loss"]

    def by_round(name: str, other: str, ratio) -> float | None:
        if "seconds" not in results.get(name, {}) or "seconds" not in results.get(other, {}):
            return None
        return statistics.median(ratio(a, b) for a, b in zip(
            results[name]["seconds_by_round"], results[other]["seconds_by_round"]))

    for name in results:
        if name == "gemms":
            continue
        entry = results[name]
        fraction = by_round(name, "gemms", lambda own, gemm: gemm / own)
        if fraction is not None:
            entry["gemm_fraction"] = fraction  # share of the fastest GEMMs' throughput
        against = "cce_policy" if name.partition(":")[0].endswith("_policy") else "cce_compile"
        vs_cce = by_round(name, against, lambda own, cce: own / cce)
        if vs_cce is not None:
            entry["time_vs_cce"] = vs_cce
            entry["memory_vs_cce"] = entry["peak_mib"] / results[against]["peak_mib"]
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--T", type=int, default=2048)
    parser.add_argument("--H", type=int, default=512)
    parser.add_argument("--V", type=int, default=131072)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=1,
                        help="sweeps over all contenders, each in a rotated order")
    parser.add_argument("--out", type=pathlib.Path)
    parser.add_argument("--only", type=lambda text: text.split(","), default=CONTENDERS,
                        help="these contenders, comma-separated; cpkit:N and cpkit_policy:N "
                             "run the fused op at chunk_rows N")
    parser.add_argument("--contender", help=argparse.SUPPRESS)
    args = parser.parse_args()
    shape = (args.T, args.H, args.V)
    if args.contender:  # a child: one contender, one JSON line
        print(json.dumps(measure(args.contender, *shape, args.repeats)))
        return
    results = {"T": args.T, "H": args.H, "V": args.V, "threads": torch.get_num_threads(),
               "rounds": args.rounds, "flops_3_gemms": 3 * 2 * args.T * args.H * args.V}
    names = tuple(args.only)
    rounds = {name: [] for name in names}  # each round's child result, per contender
    for r in range(args.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            child = subprocess.run([sys.executable, __file__, "--contender", name, "--T",
                                    str(args.T), "--H", str(args.H), "--V", str(args.V),
                                    "--repeats", str(args.repeats)],
                                   capture_output=True, text=True)
            if child.returncode != 0:  # a missing optional contender is reported, not fatal
                rounds[name].append({"error": child.stderr.strip().splitlines()[-1]})
            else:
                rounds[name].append(json.loads(child.stdout.splitlines()[-1]))
            print(f"round {r}", name, rounds[name][-1], flush=True)
    results.update(summarise(rounds))
    text = json.dumps(results, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
