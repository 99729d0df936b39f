"""Multi-node is plain `torchrun --nnodes`: two launchers on 127.0.0.1 stand in for two machines (one
rank each, static rendezvous on a free port), train two steps with sharded checkpoints, and both
finish. The checkpoint the two "nodes" wrote verifies, its HF directory loads in transformers, and its
DCP shards load into a one-process model (resharded from 2 ranks to 1) equal to that HF directory.
"""
import json
import socket
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest
import torch

from infra import checkpoint

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_launchers_as_two_nodes_train_and_checkpoint(tmp_path):
    port, out = free_port(), tmp_path / "run"
    launchers = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1",
         "--node_rank", str(node), "--master_addr", "127.0.0.1", "--master_port", str(port),
         "train.py", "--env", "tests.support.toy:Digits", "--engine", "hf", "--steps", "2", "--horizon", "2",
         "--tasks-per-step", "2", "--samples-per-task", "2", "--max-tokens", "6", "--checkpoint-format", "sharded",
         "--out", str(out)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for node in (0, 1)]
    results = [p.communicate(timeout=300) for p in launchers]
    for p, (_, err) in zip(launchers, results):
        assert p.returncode == 0, err[-3000:]

    assert len((out / "metrics.jsonl").read_text().splitlines()) == 2
    ckpt = checkpoint.latest(out / "checkpoints")
    assert ckpt.name == "step_000002" and checkpoint.verify(ckpt, 0, 1) is None
    meta = json.loads((ckpt / "state.json").read_text())
    assert meta["world"] == 2 and meta["format"] == "sharded"
    assert {"rng_rank0.pt", "rng_rank1.pt"} <= set(meta["files"])

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(ckpt / "policy", dtype=torch.float32)
    hf = {k: v.clone() for k, v in get_model_state_dict(model).items()}
    state = {"model": {k: torch.zeros_like(v) for k, v in hf.items()}}
    dcp.load(state, storage_reader=checkpoint._SafeReader(ckpt / "dcp_policy"), planner=checkpoint._SafePlanner())
    assert all(torch.equal(state["model"][k], hf[k]) for k in hf)
    assert any(float(v.abs().sum()) > 0 for v in state["model"].values())
