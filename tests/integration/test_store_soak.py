"""The store soak, small enough for CI, on both backends: repositories and batches ticked at random
by several processes at once. Nothing lost, no duplicate commit, every batch verifies, and the read
model matches a rebuild from scratch. (`lanes-es bench store --soak` runs it bigger.)"""

from __future__ import annotations

from tools.soak import run_soak


def test_processes_ticking_batches_at_random_lose_nothing(tmp_path, store_url):
    result = run_soak(store_url, tmp_path, repos=2, batches=2, processes=3, rounds=10)
    assert result.findings == []
    assert result.ticks > 0
    assert "completed" in result.batches.values()  # the soak moved batches to the end, not only ticked them
    assert len(result.batches) >= 2
