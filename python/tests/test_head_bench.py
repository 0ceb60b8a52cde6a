"""bench/head_bench.py runs end to end at a small shape, and its contenders solve one problem:
the same loss from cpkit (the fused loss and minus the mean of token_logprobs),
cut-cross-entropy, eager PyTorch and checkpointed chunks, and the same GRPO loss from
cpkit.policy_loss, token_logprobs, cut-cross-entropy and eager PyTorch."""

import json
import math
import pathlib
import subprocess
import sys

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench" / "head_bench.py"


def test_contenders_agree(tmp_path):
    out = tmp_path / "head.json"
    subprocess.run([sys.executable, str(BENCH), "--T", "130", "--H", "24", "--V", "700",
                    "--repeats", "1", "--out", str(out)], check=True, capture_output=True,
                   timeout=600)
    results = json.loads(out.read_text())
    losses = {}
    for name in ("gemms", "gemms_row_major", "cpkit", "cpkit_logprobs", "cce_compile",
                 "cce_per_token", "eager", "checkpointed", "cpkit_policy",
                 "cpkit_logprobs_policy", "cce_policy", "eager_policy"):
        entry = results[name]
        assert "error" not in entry, (name, entry)
        assert entry["seconds"] > 0 and entry["peak_mib"] >= 0, (name, entry)
        if not name.startswith("gemms"):
            losses[name] = entry["loss"]
    eager = losses["eager"]
    assert math.isfinite(eager) and eager > 0, losses
    for name, loss in losses.items():  # NaN fails: comparisons with NaN are False
        if not name.endswith("_policy"):
            assert abs(loss - eager) <= 1e-5 * eager, losses
    policy = losses["eager_policy"]  # the GRPO loss: one value from every contender
    assert math.isfinite(policy), losses
    for name in ("cpkit_policy", "cpkit_logprobs_policy", "cce_policy"):
        assert abs(losses[name] - policy) <= 1e-5 * (1 + abs(policy)), losses


def test_only_and_chunk_rows_reach_the_op(tmp_path):
    out = tmp_path / "head.json"
    subprocess.run([sys.executable, str(BENCH), "--T", "130", "--H", "24", "--V", "700",
                    "--repeats", "1", "--only", "eager,cpkit:32,cpkit_policy:-1", "--out",
                    str(out)], check=True, capture_output=True, timeout=600)
    results = json.loads(out.read_text())
    assert {"eager", "cpkit:32", "cpkit_policy:-1"} <= set(results), results
    assert "cpkit" not in results and "cce_compile" not in results, results
    eager = results["eager"]["loss"]
    assert abs(results["cpkit:32"]["loss"] - eager) <= 1e-5 * eager, results
    assert "chunk_rows" in results["cpkit_policy:-1"]["error"], results  # it reached the op


def _bench_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("head_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_rounds_compare_within_a_round():
    # The host got twice as slow in round 1: each ratio is taken within its round, then the
    # median over rounds; times are medians over rounds, peaks the largest.
    first = {"first_step_peak_mib": 1.0}
    rounds = {
        "gemms": [{"seconds": 4.0, "peak_mib": 1.0, **first},
                  {"seconds": 8.0, "peak_mib": 2.0, **first}],
        "cpkit": [{"seconds": 5.0, "peak_mib": 30.0, "loss": 2.5, "first_step_peak_mib": 40.0},
                  {"seconds": 9.0, "peak_mib": 20.0, "loss": 2.5, "first_step_peak_mib": 50.0}],
        "cce_compile": [{"seconds": 6.0, "peak_mib": 100.0, "loss": 2.5, **first},
                        {"seconds": 12.0, "peak_mib": 100.0, "loss": 2.5, **first}],
        "eager": [{"seconds": 7.0, "peak_mib": 5.0, **first}, {"error": "OutOfMemoryError"}],
    }
    out = _bench_module().summarise(rounds)
    cpkit = out["cpkit"]
    assert cpkit["seconds"] == 7.0 and cpkit["seconds_by_round"] == [5.0, 9.0]
    assert cpkit["peak_mib"] == 30.0 and cpkit["loss"] == 2.5
    assert cpkit["first_step_peak_mib"] == 50.0
    assert math.isclose(cpkit["gemm_fraction"], (4.0 / 5.0 + 8.0 / 9.0) / 2)  # not 6 / 7
    assert math.isclose(cpkit["time_vs_cce"], (5.0 / 6.0 + 9.0 / 12.0) / 2)
    assert math.isclose(cpkit["memory_vs_cce"], 0.3)
    assert out["eager"] == {"error": "OutOfMemoryError"}
    assert "gemm_fraction" not in out["gemms"]
