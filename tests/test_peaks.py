"""infra/peaks.py: each phase's peak resident memory, read from the kernel's high-water mark."""
import pytest
import torch

from infra import peaks

MB = 2**20
pytestmark = pytest.mark.skipif(not peaks.reset(), reason="the kernel's high-water mark cannot be reset here")


def _hold(mb: int) -> torch.Tensor:
    return torch.ones(mb * MB // 4, dtype=torch.float32)  # written, so resident


def test_each_phase_reads_its_own_peak_and_a_parent_counts_its_children():
    base = peaks.resident()
    with peaks.phase("test.outer"):
        with peaks.phase("test.big"):
            big = _hold(400)
            del big
        with peaks.phase("test.small"):
            small = _hold(40)
            del small
    of = peaks.of_phases()
    assert of["test.big"] - base > 390 * MB
    # the mark was reset when the small phase began: the big phase's 400 MB, freed, is not its peak
    assert of["test.small"] - base < 200 * MB
    assert of["test.outer"] >= of["test.big"]  # the parent saw its child's peak through the reset
    assert peaks.top() >= of["test.big"]       # and so did the process's peak, which the reset lowered
    step = peaks.take()
    assert step["test.big"] == of["test.big"] and peaks.take() == {}  # take() forgets what it gave


def test_a_phase_that_runs_again_keeps_its_largest_peak():
    with peaks.phase("test.again"):
        x = _hold(300)
        del x
    first = peaks.of_phases()["test.again"]
    with peaks.phase("test.again"):
        pass
    assert peaks.of_phases()["test.again"] == first
    assert peaks.take()["test.again"] == first  # both runs since the last take: the larger


def test_the_run_report_names_each_phase(tmp_path):
    import torch.distributed as dist

    from infra import lifeline

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        with peaks.phase("update"):
            x = _hold(100)
            del x
        line = lifeline.peak_report()
    finally:
        dist.destroy_process_group()
    assert line.startswith("peak resident memory per rank: ") and "by phase, largest rank: " in line
    assert f"update {peaks.of_phases()['update'] / 2**30:.2f}" in line


def test_the_bench_table_takes_each_phases_highest_step_and_marks_what_passes_the_plan(tmp_path):
    import importlib.util
    import json
    from pathlib import Path

    # loaded by path: bench/ on sys.path would shadow envs/ with bench/envs.py in later tests' subprocesses
    where = Path(__file__).resolve().parent.parent / "bench" / "phase_peaks.py"
    spec = importlib.util.spec_from_file_location("phase_peaks", where)
    phase_peaks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(phase_peaks)

    rows = [{"step": 0, "mem/plan_mb": 3000.0, "mem/peak/load_mb": 1000.0, "mem/peak/update_mb": 2900.0},
            {"step": 1, "mem/plan_mb": 3000.0, "mem/peak/update_mb": 3100.0, "mem/peak/generate_mb": 2000.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = phase_peaks.read(f"mine={tmp_path}")
    assert run["plan_mb"] == 3000.0 and run["phases"] == {"load": 1000.0, "update": 3100.0, "generate": 2000.0}
    text = phase_peaks.table([run])
    assert "| update | **3,100** (over) |" in text and "| load | 1,000 |" in text
    assert phase_peaks.read(f"{tmp_path}:2.0")["plan_mb"] == 3000.0  # a logged plan wins over the given one
