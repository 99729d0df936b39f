"""The memory probe that each training step logs (mem/rss_mb, mem/heap_mb) and bench/soak.py reads, and the
code state provenance.jsonl records."""
import subprocess
import sys

import torch

from infra.runlog import code_state, env_errors, memory_mb, trim_heap


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


def test_code_state_counts_code_changes_and_not_the_results_a_run_writes(tmp_path):
    """A protocol's pieces append to results/ while later pieces start: that must not mark them as made by
    changed code, while a changed tracked source file must."""
    def git(*args):
        subprocess.run(["git", "-c", "user.email=a@b", "-c", "user.name=a", *args], cwd=tmp_path, check=True,
                       capture_output=True)
    git("init", "-q")
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "pieces.jsonl").write_text("{}\n")
    (tmp_path / "train.py").write_text("x = 1\n")
    git("add", ".")
    git("commit", "-qm", "c")
    commit, dirty = code_state(tmp_path)
    assert len(commit) == 40 and dirty is False
    (tmp_path / "results" / "pieces.jsonl").write_text("{}\n{}\n")
    (tmp_path / "untracked.py").write_text("")
    assert code_state(tmp_path) == (commit, False)
    (tmp_path / "train.py").write_text("x = 2\n")
    assert code_state(tmp_path) == (commit, True)


def test_env_errors_counts_each_steps_episodes_once(tmp_path):
    """The run's closing line about env_error episodes: each step's share times its episodes; a step logged twice
    (a resumed run repeats its last step) counts once; a run without the file has none."""
    import json
    rows = [{"step": 0, "episodes": 32, "end/env_error": 0.0625}, {"step": 1, "episodes": 32, "end/env_error": 0.5},
            {"step": 1, "episodes": 32, "end/env_error": 0.25}, {"step": 2, "eval/success": 0.4},
            {"step": 2, "episodes": 16, "end/env_error": 0.0}]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert env_errors(path) == 2 + 8 + 0
    assert env_errors(tmp_path / "none.jsonl") == 0


MAPPED_AFTER_A_FREE = """
import ctypes, sys, torch
sys.path.insert(0, {root!r})
from infra.runlog import _Mallinfo2, mmap_threshold
if {fixed}:
    assert mmap_threshold(1)
info = ctypes.CDLL(None).mallinfo2
info.restype = _Mallinfo2
big = torch.empty(8 * 2**20, dtype=torch.uint8)  # mapped under glibc's starting threshold (128 kB)...
del big                                           # ...and its free raises that threshold to 8 MB
before = info().hblkhd
held = torch.empty(4 * 2**20, dtype=torch.uint8)
print(info().hblkhd - before)                     # bytes of the 4 MB tensor that are mapped
"""


def test_a_fixed_mmap_threshold_keeps_mapping_what_glibc_would_put_on_the_heap():
    """glibc's dynamic threshold: once a mapped block is freed, blocks below its size come from the heap (where a
    wider one cannot reuse their holes: the decode loop's per-turn KV); --mmap-threshold keeps mapping them."""
    from pathlib import Path
    root = str(Path(__file__).resolve().parent.parent)
    mapped = {}
    for fixed in (False, True):
        out = subprocess.run([sys.executable, "-c", MAPPED_AFTER_A_FREE.format(root=root, fixed=fixed)],
                             capture_output=True, text=True, check=True).stdout
        mapped[fixed] = int(out.split()[-1])
    assert mapped[False] == 0                 # the dynamic threshold put it on the heap
    assert mapped[True] >= 4 * 2**20          # the fixed one mapped it


def test_an_mmap_threshold_glibc_would_not_keep_fixed_is_one_line_before_start_up():
    import config as configs
    from launch import checks
    assert checks.check(configs.parse(["--mmap-threshold", "40"]), 1).startswith("--mmap-threshold must be in")
    assert checks.check(configs.parse(["--mmap-threshold", "4"]), 1) is None
