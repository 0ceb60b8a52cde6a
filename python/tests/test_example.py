"""The examples under torchrun: the trainer (examples/python/train_tiny_lm.py) briefly with 4
ranks, for every layout: per-step CP losses and final weights equal one-process training on
the unsharded batches; the GRPO step (examples/python/grpo_step.py): old log-probabilities
equal fp64 log_softmax, and one step's weights equal one process's."""

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


GRPO = HERE.parents[1] / "examples" / "python" / "grpo_step.py"


@pytest.mark.parametrize("cp, layout", [(3, "contiguous"), (4, "head_tail")])
def test_grpo_step_matches_one_process(torchrun, cp, layout):
    result = subprocess.run(
        [*torchrun, "--standalone", f"--nproc_per_node={cp}", str(GRPO), "--layout", layout],
        env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-8000:]
    assert "MATCH (tolerance 1e-5)" in result.stdout, result.stdout
