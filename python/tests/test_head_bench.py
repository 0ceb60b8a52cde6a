"""bench/head_bench.py runs end to end at a small shape, and its contenders solve one problem:
the same loss from cpkit (the fused loss and minus the mean of token_logprobs),
cut-cross-entropy, eager PyTorch and checkpointed chunks."""

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
                 "cce_per_token", "eager", "checkpointed"):
        entry = results[name]
        assert "error" not in entry, (name, entry)
        assert entry["seconds"] > 0 and entry["peak_mib"] >= 0, (name, entry)
        if not name.startswith("gemms"):
            losses[name] = entry["loss"]
    eager = losses["eager"]
    assert math.isfinite(eager) and eager > 0, losses
    for name, loss in losses.items():  # NaN fails: comparisons with NaN are False
        assert abs(loss - eager) <= 1e-5 * eager, losses
