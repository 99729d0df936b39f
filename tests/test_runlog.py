"""The memory probe that each training step logs (mem/rss_mb, mem/heap_mb) and bench/soak.py reads."""
import torch

from infra.runlog import memory_mb, trim_heap


def test_live_heap_follows_allocations_and_frees():
    # after a long test session the heap holds freed pages that are still resident: a new allocation could
    # reuse them without raising the RSS, so they go back to the system first
    trim_heap()
    before = memory_mb()
    x = torch.ones(100 * 2**20 // 4)  # 100 MB, touched, so it is resident too
    held = memory_mb()
    del x
    after = memory_mb()
    assert 95 < held["heap_mb"] - before["heap_mb"] < 110
    assert held["rss_mb"] - before["rss_mb"] > 90
    assert abs(after["heap_mb"] - before["heap_mb"]) < 5  # freed memory leaves the live heap at once
