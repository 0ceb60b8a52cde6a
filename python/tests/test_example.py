"""The trainer example (examples/python/train_tiny_lm.py) briefly, under torchrun with 4
ranks, for every layout: per-step CP losses and final weights equal one-process training on
the unsharded batches."""

from __future__ import annotations

import os
import subprocess

import pytest

from conftest import HERE

EXAMPLE = HERE.parents[1] / "examples" / "python" / "train_tiny_lm.py"


@pytest.mark.parametrize("layout", ["contiguous", "head_tail", "balanced"])
def test_tiny_lm_trains_like_one_process(torchrun, layout):
    result = subprocess.run(
        [*torchrun, "--standalone", "--nproc_per_node=4", str(EXAMPLE), "--steps", "8",
         "--layout", layout],
        env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-8000:]
    assert "MATCH (tolerance 1e-5)" in result.stdout, result.stdout
    assert result.stdout.count("step ") == 8, result.stdout
