#!/usr/bin/env python3
"""The Python layer's costs, measured in one run (docs/performance.md, "Python"):

1. Call overhead: torch.ops.cpkit.shifted_cp_loss (and the public cpkit.shifted_cp_loss)
   from Python against the same fused call from C++ (cpkit-bench's BM_CE_CallSmall, run as a
   subprocess of this script on the same shape), at [1, 16, 1024]; best of 7 medians each.
3. The cost of contiguous causal sharding: (query, key) pairs each rank's varlen segments
   attend (from cpkit's offsets), max over ranks / mean, for the demo's packed row and for
   one long document, CP 2, 4, 8.
2. CE forward + backward at T 1024, V 131072 float32 on the same CPU tensors: cpkit against
   torch.compile(F.cross_entropy) (inductor), each with an untimed first step; cpkit with its
   host buffer cache on (default) and off (CPKIT_HOST_CACHE_BYTES=0, a second process).
4. Does the work model predict time? Per layout (contiguous, head_tail, balanced) at CP 4,
   each rank's attention from its own offsets, one rank at a time on this CPU: the keys its
   varlen call reads (k_index or [k_begin, k_end) of the rank-order gathered keys), then per
   segment the fully visible keys and the causal square as two SDPA flash calls merged by
   their log-sum-exp (exactly bottom-right causal attention). Max over mean of the per-rank
   seconds next to max over mean of the attended pairs, on one document and a packed row.

Usage: <torch venv>/bin/python bench/python_bench.py BUILD_DIR [--out results.json]
       (--only-layout-time: section 4 alone, no BUILD_DIR needed)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

import cpkit


def timed(step, repeats: int) -> float:
    """Median seconds of `repeats` calls after one untimed call."""
    step()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def inputs(T: int, V: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(1, T, V, generator=g) * 4).requires_grad_(True)
    labels = torch.randint(0, V, (1, T), generator=g)
    valid = torch.ones(T, dtype=torch.bool)
    return logits, labels, valid


def call_overhead(build: pathlib.Path) -> dict:
    logits, labels, valid = inputs(16, 1024)
    raw = logits.detach()
    calls = {"op": lambda: torch.ops.cpkit.shifted_cp_loss(raw, labels, valid, "", 0.0),
             "public": lambda: cpkit.shifted_cp_loss(raw, labels, valid)}
    # Microseconds are noisy on 2 shared cores: rounds alternate, the best median counts.
    best = {name: math.inf for name in calls}
    for _ in range(7):
        for name, call in calls.items():
            best[name] = min(best[name], timed(call, 300))
    bench = subprocess.run(
        [str(build / "bench" / "cpkit-bench"), "--benchmark_filter=BM_CE_CallSmall",
         "--benchmark_repetitions=7", "--benchmark_format=json"],
        capture_output=True, text=True, check=True)
    runs = [b for b in json.loads(bench.stdout)["benchmarks"] if b.get("run_type") == "iteration"]
    unit = {"us": 1, "ns": 1e-3, "ms": 1e3}[runs[0]["time_unit"]]
    cpp_us = min(b["real_time"] for b in runs) * unit
    return {"shape": [1, 16, 1024], "cpp_us": cpp_us, "op_us": best["op"] * 1e6,
            "public_us": best["public"] * 1e6, "op_overhead_us": best["op"] * 1e6 - cpp_us,
            "public_overhead_us": best["public"] * 1e6 - cpp_us}


def attended_pairs(cu_q: torch.Tensor, cu_k: torch.Tensor) -> int:
    """Pairs a causal, bottom-right aligned varlen kernel computes: query a of a segment of m
    queries and n keys sees a + n - m + 1 keys."""
    total = 0
    for m, n in zip((cu_q[1:] - cu_q[:-1]).tolist(), (cu_k[1:] - cu_k[:-1]).tolist()):
        total += m * (n - m + 1) + m * (m - 1) // 2
    return total


def imbalance() -> list:
    rows = {
        # cpkit-demo's default row: documents 7, 0, 11, 3, 9 in slots rounded up to 2, tail 3.
        "demo packed row (T 37)": ([7, 0, 11, 3, 9], [8, 0, 12, 4, 10], 37),
        "one document (T 8192)": ([8192], [8192], 8192),
    }
    out = []
    for name, (lens, slots, T) in rows.items():
        labels = torch.zeros(1, T, dtype=torch.long)
        for cp in (2, 4, 8):
            pairs = []
            for rank in range(cp):
                cu_q, cu_k, _, _ = torch.ops.cpkit.attention_offsets(
                    labels, None, labels, None, None, torch.tensor([lens]), torch.tensor([slots]),
                    "thd", cp, rank, 1, 1, 0)
                pairs.append(attended_pairs(cu_q, cu_k))
            out.append({"row": name, "cp": cp, "pairs_per_rank": pairs,
                        "max_over_mean": max(pairs) / (sum(pairs) / cp)})
    return out


def segment_attention(q, k, v, cu_q, cu_k):
    """Varlen causal attention, bottom-right aligned, of [tokens, H, D] tensors: per segment
    the keys before its queries (all visible) and the square of its own (causal), merged."""
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    out = torch.empty_like(q)
    bounds = zip(cu_q[:-1].tolist(), cu_q[1:].tolist(), cu_k[:-1].tolist(), cu_k[1:].tolist())
    for q0, q1, k0, k1 in bounds:
        m, n = q1 - q0, k1 - k0
        if m == 0:
            continue
        heads = lambda t: t.transpose(0, 1).unsqueeze(0)  # noqa: E731  [1, H, tokens, D]
        qs = heads(q[q0:q1])
        o_sq, l_sq = flash(qs, heads(k[k1 - m:k1]), heads(v[k1 - m:k1]), 0.0, True)
        if n > m:
            o_r, l_r = flash(qs, heads(k[k0:k1 - m]), heads(v[k0:k1 - m]), 0.0, False)
            lse = torch.logaddexp(l_sq, l_r)
            o_sq = o_sq * (l_sq - lse).exp().unsqueeze(-1) + o_r * (l_r - lse).exp().unsqueeze(-1)
        out[q0:q1] = o_sq[0].transpose(0, 1)
    return out


def lognormal_slots(T: int, median: int, seed: int) -> list:
    g = torch.Generator().manual_seed(seed)
    slots, used = [], 0
    while used < T:
        n = int(math.exp(math.log(median) + 1.2 * float(torch.randn(1, generator=g))))
        n = max(1, min(n, T - used))
        slots.append(n)
        used += n
    return slots


def layout_time(heads: int = 2, dim: int = 64, cp: int = 4) -> list:
    rows = {"one document (T 8192)": [8192],
            "packed lognormal row (T 16384, median 512)": lognormal_slots(16384, 512, seed=3)}
    out = []
    for name, slots in rows.items():
        T = sum(slots)
        batch = {"input_ids": torch.zeros(1, T, dtype=torch.long),
                 "labels": torch.zeros(1, T, dtype=torch.long), "qkv_format": "thd",
                 "seq_lens": torch.tensor([slots]), "seq_lens_padded": torch.tensor([slots])}
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(T, heads, dim, generator=g) for _ in range(3))
        for kind in ("contiguous", "head_tail", "balanced"):
            positions = [torch.tensor(p) for p in rank_positions(kind, slots, cp)]
            padded = sum(len(p) for p in positions)
            qp, kp, vp = (torch.cat([t, t.new_zeros(padded - T, heads, dim)]) for t in (q, k, v))
            gathered_k, gathered_v = kp[torch.cat(positions)], vp[torch.cat(positions)]
            seconds, pairs = [], []
            for rank in range(cp):
                cu_q, cu_k, scalars, k_index = torch.ops.cpkit.attention_offsets(
                    batch["input_ids"], None, batch["labels"], None, None, batch["seq_lens"],
                    batch["seq_lens_padded"], "thd", cp, rank, 1, 1, 0, kind)
                k_begin, k_end = scalars.tolist()[2:]
                local_q = qp[positions[rank]]

                def step():
                    if kind == "contiguous":
                        keys, values = gathered_k[k_begin:k_end], gathered_v[k_begin:k_end]
                    else:
                        keys, values = gathered_k[k_index], gathered_v[k_index]
                    return segment_attention(local_q, keys, values, cu_q, cu_k)

                seconds.append(timed(step, 5))
                pairs.append(attended_pairs(cu_q, cu_k))
            out.append({"row": name, "cp": cp, "layout": kind, "seconds_per_rank": seconds,
                        "pairs_per_rank": pairs,
                        "time_max_over_mean": max(seconds) / (sum(seconds) / cp),
                        "work_max_over_mean": max(pairs) / (sum(pairs) / cp)})
    return out


def rank_positions(kind: str, slots: list, cp: int) -> list:
    """Each rank's global positions in a packed row of these slots (the library's plan)."""
    out = []
    for rank in range(cp):
        values = torch.ops.cpkit.shard_layout(sum(slots), cp, rank, 1, kind, slots)
        out.append([t for b, e in zip(values[3::2], values[4::2]) for t in range(b, e)])
    return out


def cpkit_ce(T: int, V: int, repeats: int) -> float:
    logits, labels, valid = inputs(T, V)

    def step():
        loss = cpkit.shifted_cp_loss(logits, labels, valid)
        (grad,) = torch.autograd.grad(loss, logits)
        return grad

    return timed(step, repeats)


def compiled_ce(T: int, V: int, repeats: int) -> float:
    logits, labels, valid = inputs(T, V)
    targets = torch.where(valid.view(1, T), labels, -100)

    @torch.compile
    def loss_of(x, y):
        return F.cross_entropy(x[0, :-1], y[0, 1:], ignore_index=-100)

    def step():
        loss = loss_of(logits, targets)
        (grad,) = torch.autograd.grad(loss, logits)
        return grad

    return timed(step, repeats)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("build", type=pathlib.Path, nargs="?")
    parser.add_argument("--out", type=pathlib.Path)
    parser.add_argument("--only-cpkit-ce", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--only-layout-time", action="store_true")
    args = parser.parse_args()
    if args.only_layout_time:
        text = json.dumps({"threads": torch.get_num_threads(), "layout_time": layout_time()},
                          indent=1)
        print(text)
        if args.out:
            args.out.write_text(text + "\n")
        return
    if args.build is None:
        parser.error("BUILD_DIR is required (cpkit-bench's build tree)")
    T, V, repeats = 1024, 131072, 7
    if args.only_cpkit_ce:  # the cache-off child process
        print(json.dumps({"seconds": cpkit_ce(T, V, repeats)}))
        return
    results = {"threads": torch.get_num_threads(), "call": call_overhead(args.build),
               "imbalance": imbalance(), "layout_time": layout_time()}
    child = subprocess.run(
        [sys.executable, __file__, str(args.build), "--only-cpkit-ce"],
        env={**os.environ, "CPKIT_HOST_CACHE_BYTES": "0"}, capture_output=True, text=True,
        check=True)
    ce = {"T": T, "V": V, "bytes": 8 * T * V,
          "cpkit_s": cpkit_ce(T, V, repeats),
          "cpkit_cache_off_s": json.loads(child.stdout.splitlines()[-1])["seconds"],
          "torch_compile_s": compiled_ce(T, V, repeats)}
    ce["speedup"] = ce["torch_compile_s"] / ce["cpkit_s"]
    ce["speedup_cache_off"] = ce["torch_compile_s"] / ce["cpkit_cache_off_s"]
    results["ce"] = ce
    text = json.dumps(results, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
