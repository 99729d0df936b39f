"""--report-to (infra/trackers.py): a short real run of train.py hands each tracker every number of
metrics.jsonl at its step, evaluations included, and the config; the trackers write into the run folder and
nothing of theirs reaches the console; a tracker that is not installed is refused with the pip command."""
import importlib.util
import json
import math
import os
import re
import sqlite3
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from launch import checks
import config
from infra import trackers

ROOT = Path(__file__).resolve().parent.parent
RUNS = {}  # --report-to value: (out, stdout, stderr); each run once per session, shared by the tests


def train(tmp_path_factory, report_to: str):
    """Two steps of the toy env on the tiny model in one process (about 30 s), with an evaluation at the
    start and the end, so metrics.jsonl has evaluation metrics too."""
    if report_to not in RUNS:
        out = tmp_path_factory.mktemp("run")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "TRACKIO_"))}  # the defaults
        proc = subprocess.run([sys.executable, "train.py", "--env", "tests.support.toy:Digits", "--steps", "2", "--engine",
                               "hf", "--max-tokens", "6", "--eval-every", "2", "--eval-tasks", "2",
                               "--report-to", report_to, "--out", str(out)],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        RUNS[report_to] = out, proc.stdout, proc.stderr
    return RUNS[report_to]


def rows(out) -> list[dict]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1] and "eval_start/success" in rows[0] and "eval/success" in rows[1]
    return rows


def same(logged: float, row_value, float32: bool = False) -> bool:
    """Whether a tracker's number is metrics.jsonl's (TensorBoard keeps float32), NaN included."""
    want = float(row_value)
    if float32:
        want = struct.unpack("f", struct.pack("f", want))[0]
    return logged == want or (math.isnan(logged) and math.isnan(want))


def test_tensorboard_holds_every_metric_at_its_step_and_the_config(tmp_path_factory):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, _, _ = train(tmp_path_factory, "tensorboard")
    events = EventAccumulator(str(out / "tb"), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    for row in rows(out):
        for key, value in row.items():
            if key == "step":
                continue
            (point,) = [e for e in events.Scalars(key) if e.step == row["step"]]
            assert same(point.value, value, float32=True), (key, row["step"], point.value, value)
    (text,) = events.Tensors("config/text_summary")
    logged = json.loads(text.tensor_proto.string_val[0].decode().replace("\n    ", "\n"))
    assert logged == json.loads((out / "config.json").read_text()) and logged["report_to"] == "tensorboard"


def wandb_records(path: Path):
    """The records of a .wandb file (wandb's append-only log: 32 KiB blocks of chunks, each with a 7-byte
    header: CRC32, length, kind 1 full / 2 first / 3 middle / 4 last; the file opens with a 7-byte header)."""
    from wandb.proto import wandb_internal_pb2

    data, pos, block, chunks = path.read_bytes(), 7, 1 << 15, b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunks, pos = chunks + data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunks)
            chunks = b""
            yield record


def test_wandb_writes_an_offline_run_in_the_run_folder(tmp_path_factory):
    pytest.importorskip("wandb")
    out, _, _ = train(tmp_path_factory, "wandb")
    (log,) = (out / "wandb").glob("offline-run-*/run-*.wandb")  # offline: nothing was sent anywhere
    history, configs = {}, {}
    for record in wandb_records(log):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            items = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            history[items["_step"]] = items
        elif kind == "run":
            configs.update({item.key: json.loads(item.value_json) for item in record.run.config.update})
    for row in rows(out):
        for key, value in row.items():
            if key != "step":
                assert same(history[row["step"]][key], value), (key, row["step"])
    assert configs["report_to"] == "wandb" and configs["env"] == "tests.support.toy:Digits"


def test_trackio_keeps_its_database_in_the_run_folder(tmp_path_factory):
    pytest.importorskip("trackio")
    out, _, _ = train(tmp_path_factory, "trackio")
    (db,) = (out / "trackio").glob("*.db")  # trackio's local store: one SQLite file per project
    with sqlite3.connect(db) as conn:
        logged = {step: json.loads(metrics) for step, metrics in conn.execute("SELECT step, metrics FROM metrics")}
        (saved,) = [json.loads(c) for (c,) in conn.execute("SELECT config FROM configs")]
    for row in rows(out):
        for key, value in row.items():
            if key != "step":
                assert same(logged[row["step"]][key], value), (key, row["step"])
    assert saved["report_to"] == "trackio"


def console(out, stdout: str, stderr: str) -> list[str]:
    """The console's lines less what differs between two identical runs: the run folder, the progress bar
    (a timer), every figure (seconds, memory)."""
    text = (stdout + "\n" + stderr).replace(str(out), "OUT")
    text = re.sub(r"train:\s*\d+%\|.*?\]", "", text)
    text = re.sub(r"\d+(\.\d+)?", "#", text)
    return [line for line in re.split(r"[\r\n]+", text) if line.strip()]


def test_trackers_print_nothing_on_the_console(tmp_path_factory):
    quiet = console(*train(tmp_path_factory, "none"))
    for name in ["tensorboard"] + [n for n in ("wandb", "trackio") if n in trackers.chosen("all")]:
        out, stdout, stderr = train(tmp_path_factory, name)
        lines = console(out, stdout, stderr)
        assert lines == quiet, (name, lines, quiet)
        assert not re.search(r"wandb|trackio|tensorflow|tensorboard", "\n".join(lines), re.I), lines
        assert (out / "trackers.log").exists()


def test_an_unknown_or_missing_tracker_is_refused_in_one_line_with_the_fix(monkeypatch):
    problem = checks.check(config.Config(report_to="tensorboard,mlflow"), world=2)
    assert problem.startswith("unknown --report-to 'mlflow'") and "tensorboard, wandb, trackio" in problem
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    problem = checks.check(config.Config(report_to="tensorboard, wandb"), world=2)
    assert problem == "--report-to wandb needs the wandb package: pip install wandb"
    assert "wandb" not in trackers.chosen("all") and "tensorboard" in trackers.chosen("all")
    assert checks.check(config.Config(report_to="all"), world=2) is None
    assert trackers.chosen("none") == [] and config.Config().report_to == "none"
