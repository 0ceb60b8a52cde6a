"""Shared fixtures: a one-process gloo world, so the ops resolve a real process group."""

from __future__ import annotations

import os

# No inductor/AOT graph caches, here and in torchrun workers: a graph cached from an earlier
# cpkit hides a change to the ops' Python backward rules (seen: a compiled-backward test
# passed with a broken rule until the cache was off). Set before torch is imported.
os.environ["TORCHINDUCTOR_FORCE_DISABLE_CACHES"] = "1"

import pathlib  # noqa: E402
import shutil
import sys

import pytest
import torch.distributed as dist

HERE = pathlib.Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def world1(tmp_path_factory):
    """A gloo process group of one rank (CP = 1 through a real group name)."""
    store = tmp_path_factory.mktemp("store") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


@pytest.fixture(scope="session")
def torchrun() -> list[str]:
    """torchrun of the interpreter running the tests."""
    path = pathlib.Path(sys.executable).with_name("torchrun")
    found = str(path) if path.exists() else shutil.which("torchrun")
    assert found, "torchrun not found next to the interpreter"
    return [found]
