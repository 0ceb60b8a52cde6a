"""cpkit.pack_documents (docs/spec.md section 2c) from Python: every document in exactly one
row, in input order within it, no row past its capacity; with room to spare the rows' work
is within the greedy (LPT) bound of even, and a sliding window changes what "work" weighs."""

from __future__ import annotations

import random

import cpkit


def _work(n: int, window: int = 0) -> int:
    return sum(min(p + 1, window) if window else p + 1 for p in range(n))


def test_rows_partition_the_documents_within_capacity():
    rng = random.Random(7)
    for _ in range(50):
        lengths = [rng.choice([rng.randint(1, 40), rng.randint(40, 900)]) for _ in range(30)]
        rows = rng.randint(1, 6)
        capacity = sum(lengths) // rows + max(lengths)
        packed = cpkit.pack_documents(lengths, rows, capacity, window=rng.choice([0, 64]))
        assert len(packed) == rows
        assert sorted(i for row in packed for i in row) == list(range(len(lengths)))
        for row in packed:
            assert row == sorted(row)
            assert sum(lengths[i] for i in row) <= capacity


def test_work_is_even_within_the_greedy_bound():
    rng = random.Random(11)
    for _ in range(50):
        lengths = [rng.randint(1, 500) for _ in range(rng.randint(1, 40))]
        rows = rng.randint(1, 8)
        packed = cpkit.pack_documents(lengths, rows, sum(lengths))
        work = [sum(_work(lengths[i]) for i in row) for row in packed]
        largest = max(_work(n) for n in lengths)
        assert max(work) * rows <= sum(work) + largest * rows


def test_a_window_caps_the_work_of_long_documents():
    # Without a window the 40-token document outweighs the four 20-token ones together
    # (820 against 4 x 210) and keeps a row to itself; with a window of 4 it weighs 154
    # against 74 each, so the last one joins it.
    lengths = [40, 20, 20, 20, 20]
    assert cpkit.pack_documents(lengths, 2, 80) == [[0], [1, 2, 3, 4]]
    assert cpkit.pack_documents(lengths, 2, 80, window=4) == [[0, 4], [1, 2, 3]]
