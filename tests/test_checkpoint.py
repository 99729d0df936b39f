"""Checkpoints on 2 real gloo ranks (FSDP2, the tiny model), in both formats:

- save and load round trip: a model rebuilt from the checkpoint holds the saved weights exactly (for
  the sharded format even though its HF directory is bf16: the fp32 masters come from the DCP shards),
  its next optimizer step equals the original's (Adam moments restored), and the RNG continues;
- `resumable` skips a truncated or corrupted newest checkpoint with a one-line warning, and stops with a
  one-line error when none is usable;
- loading refuses pickles that would run code (optimizer/RNG files, DCP metadata and values);
- `save_model` (the warm start's HF directory, written by rank 0 alone) completes and loads.
"""
import functools
import json
import pickle
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from infra import checkpoint
from tests.test_distributed import WORLD, spawn


def _train_save_reload(root, sharded, rank):
    from torch.distributed.device_mesh import init_device_mesh
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from infra import distributed
    from models.tiny import tiny_model_dir

    mesh = init_device_mesh("cpu", (WORLD,))
    tok = AutoTokenizer.from_pretrained(tiny_model_dir())

    def build(path):
        model = distributed.shard(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), mesh, "float32", False)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-2)

    def step(model, opt, seed):
        g = torch.Generator().manual_seed(seed * 10 + rank)  # each rank its own data
        ids = torch.randint(0, 1000, (2, 16), generator=g)
        model(input_ids=ids, use_cache=False).logits.float().logsumexp(-1).mean().backward()
        opt.step()
        opt.zero_grad()

    def full(model):
        return {k: v.full_tensor().clone() for k, v in model.state_dict().items()}

    model, opt = build(tiny_model_dir())
    for s in (1, 2):
        step(model, opt, s)
        ckpt = checkpoint.save(root, s, {"policy": model}, {"policy": opt}, tok, sharded=sharded,
                               dtype=torch.bfloat16)
    saved, rng_after_save = full(model), torch.rand(4)
    step(model, opt, 3)
    reference = full(model)

    model2, opt2 = build(str(ckpt / "policy"))
    restored_step = checkpoint.load_training_state(ckpt, {"policy": model2}, {"policy": opt2}, rank, WORLD)
    checkpoint.restore_rng(ckpt, rank, WORLD)
    loaded, rng_after_load = full(model2), torch.rand(4)
    step(model2, opt2, 3)
    after = full(model2)
    checkpoint.save_model(Path(root).parent / "warmstart", model2, tok, rank)  # rank 0 alone writes it
    diff = lambda a, b: max(float((a[k] - b[k]).abs().max()) for k in a)  # noqa: E731
    return {"step": restored_step, "loaded": diff(saved, loaded), "next_step": diff(reference, after),
            "rng": torch.equal(rng_after_save, rng_after_load)}


@pytest.mark.parametrize("sharded", [False, True], ids=["full", "sharded"])
def test_round_trip_and_fallback_from_a_broken_newest_checkpoint(tmp_path, capsys, sharded):
    root = tmp_path / "checkpoints"
    for r in spawn(functools.partial(_train_save_reload, str(root), sharded), "gloo"):
        assert r["step"] == 2 and r["rng"]
        assert r["loaded"] == 0.0 and r["next_step"] == 0.0, r

    warm = AutoModelForCausalLM.from_pretrained(tmp_path / "warmstart")  # save_model's plain HF directory
    assert warm.num_parameters() > 0 and not list(tmp_path.glob(".warmstart*"))

    meta = json.loads((root / "step_000002" / "state.json").read_text())
    assert meta["format"] == ("sharded" if sharded else "full") and meta["world"] == WORLD
    assert any(f.startswith("dcp_policy/") for f in meta["files"]) == sharded
    assert (root / "latest").read_text() == "step_000002" and not list(root.glob(".*.tmp"))
    from safetensors import safe_open
    policy = root / "step_000002" / "policy"  # the HF directory vLLM and transformers load
    assert AutoModelForCausalLM.from_pretrained(policy).num_parameters() > 0
    with safe_open(policy / "model.safetensors", "pt") as f:
        expected = torch.bfloat16 if sharded else torch.float32
        assert {f.get_tensor(k).dtype for k in f.keys()} == {expected}

    assert checkpoint.resumable(root, 0, 1) == root / "step_000002"
    weights = root / "step_000002" / "policy" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])  # truncated, as by a power cut before fsync
    capsys.readouterr()
    assert checkpoint.resumable(root, 0, 1) == root / "step_000001"
    warning = capsys.readouterr().err.strip().splitlines()
    assert len(warning) == 1 and "step_000002" in warning[0] and "truncated" in warning[0]
    # moved out of the step_* set, so pruning after the next save cannot keep it and delete step_000001
    assert (root / "broken_step_000002").is_dir() and not (root / "step_000002").exists()

    victim = sorted(p for p in (root / "step_000001").rglob("*") if p.is_file() and p.name != "state.json")[0]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte, same size
    victim.write_bytes(bytes(data))
    with pytest.raises(SystemExit):
        checkpoint.resumable(root, 0, 1)
    lines = capsys.readouterr().err.strip().splitlines()
    assert "corrupted" in lines[0] and lines[-1].startswith("error: no complete checkpoint")
    assert (root / "step_000001").is_dir()  # with no complete checkpoint, nothing is moved


class _Evil:
    """A pickle that touches a file when loaded: what a crafted checkpoint could do with plain pickle."""

    def __init__(self, target):
        self.target = target

    def __reduce__(self):
        return Path.touch, (Path(self.target),)


def test_loading_refuses_pickles_that_run_code(tmp_path):
    import torch.distributed.checkpoint as dcp

    sentinel = tmp_path / "ran"
    ckpt = tmp_path / "step_000001"
    ckpt.mkdir()
    (ckpt / "state.json").write_text(json.dumps({"step": 1, "world": 1, "format": "full", "files": {}}))
    torch.save({"torch": torch.get_rng_state(), "python": _Evil(sentinel)}, ckpt / "rng_rank0.pt")
    with pytest.raises(pickle.UnpicklingError):
        checkpoint.restore_rng(ckpt, rank=0, world=1)

    dcp.save({"w": torch.ones(2), "lr": 0.1, "evil": _Evil(sentinel)}, checkpoint_id=tmp_path / "values")
    with pytest.raises(BaseException, match="Weights only load failed"):  # DCP wraps it per rank
        dcp.load({"w": torch.zeros(2), "lr": 0.0, "evil": None}, storage_reader=checkpoint._SafeReader(tmp_path / "values"),
                 planner=checkpoint._SafePlanner())
    (tmp_path / "values" / ".metadata").write_bytes(pickle.dumps(_Evil(sentinel)))
    with pytest.raises(pickle.UnpicklingError):
        checkpoint._SafeReader(tmp_path / "values").read_metadata()
    assert not sentinel.exists()


def test_metadata_naming_a_python_3_13_path_loads(tmp_path):
    """DCP pickles the checkpoint's path into `.metadata`; Python 3.13 pickles a PosixPath as
    `pathlib._local.PosixPath`, a name the restricted unpickler refused (and 3.11 cannot even import),
    so a sharded checkpoint written on 3.13 could not be resumed. Here a metadata file is rewritten the
    way 3.13 writes it, and the checkpoint loads."""
    import torch.distributed.checkpoint as dcp

    dcp.save({"w": torch.arange(3.0)}, checkpoint_id=tmp_path / "dcp")
    meta = tmp_path / "dcp" / ".metadata"
    data = pickle.dumps(pickle.loads(meta.read_bytes()), protocol=2)  # protocol 2: names in plain text
    assert data.count(b"cpathlib\nPosixPath\n") == 1  # the path is there, under 3.11's name
    meta.write_bytes(data.replace(b"cpathlib\nPosixPath\n", b"cpathlib._local\nPosixPath\n"))
    assert checkpoint._SafeReader(tmp_path / "dcp").read_metadata().storage_meta.checkpoint_id == tmp_path / "dcp"
    state = {"w": torch.zeros(3)}
    dcp.load(state, storage_reader=checkpoint._SafeReader(tmp_path / "dcp"), planner=checkpoint._SafePlanner())
    assert state["w"].tolist() == [0.0, 1.0, 2.0]
    # and nothing else in pathlib's reach: a path class, not the module's functions
    meta.write_bytes(data.replace(b"cpathlib\nPosixPath\n", b"cpathlib._local\nos\n"))
    with pytest.raises(pickle.UnpicklingError):
        checkpoint._SafeReader(tmp_path / "dcp").read_metadata()
