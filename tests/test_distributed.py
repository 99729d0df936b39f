"""The trainer's collectives and FSDP2 wrap on 2 real gloo ranks (torch.multiprocessing, no torchrun):

- every host-tensor collective the trainer runs (all_sum, all_max, the cross-rank advantages and
  whitening) works under a group built the way the GPU path builds it, `distributed.backend("cuda")`, with
  gloo standing in for NCCL on the cuda side, and the old NCCL-only string's analogue fails;
- the cross-rank advantages equal `algorithms.advantages` on the gathered batch, for every estimator;
- `distributed.shard` puts trained models in train mode (so activation checkpointing really runs) and the
  frozen reference in eval mode.
"""
import datetime
import functools
import os
import random
import tempfile
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import algorithms as A
from launch import checks
import config as configs
from infra import distributed, peaks
import train
from studies.hooks import Studies

WORLD = 2


def _run(rank, fn, init_file, backend, results, timeout=None):
    store = dist.FileStore(init_file, WORLD)
    try:
        extra = {"timeout": datetime.timedelta(seconds=timeout)} if timeout else {}  # a hang becomes an error
        dist.init_process_group(backend, store=store, rank=rank, world_size=WORLD, **extra)
        results[rank] = fn(rank)
    except Exception:  # noqa: BLE001 - sent back to the test, which fails with it
        results[rank] = "ERROR " + traceback.format_exc()
    finally:
        # a store barrier, not a collective (the failing backend has none for CPU tensors): no rank
        # tears its group down while the other still connects or reduces
        store.set(f"done{rank}", "1")
        store.wait([f"done{r}" for r in range(WORLD)])
        if dist.is_initialized():
            dist.destroy_process_group()


def spawn(fn, backend, timeout=None):
    with tempfile.TemporaryDirectory() as tmp, mp.Manager() as manager:
        results = manager.dict()
        mp.start_processes(_run, args=(fn, os.path.join(tmp, "init"), backend, results, timeout), nprocs=WORLD,
                           start_method="spawn")  # fork after torch started threads can deadlock
        out = [results[r] for r in range(WORLD)]
    for r in out:
        assert not (isinstance(r, str) and r.startswith("ERROR")), r
    return out


def gpu_style_backend() -> str:
    """distributed.backend("cuda") with gloo in NCCL's place: the same per-device routing, runnable on CPU."""
    return distributed.backend("cuda").replace("nccl", "gloo")


def batch_for(rank: int, seed: int = 0) -> dict:
    """The whole step's batch (same on every rank); each rank keeps its contiguous share."""
    rng = random.Random(seed)
    B, T = 8, 12
    mask = torch.zeros(B, T)
    for i in range(B):
        start = rng.randint(1, 4)
        mask[i, start:start + rng.randint(2, 7)] = 1
        mask[i, start + 8:T] = float(rng.random() < 0.5)
    rewards = torch.tensor([0.97] * 4 + [rng.choice((0.0, 0.25, 1.0)) for _ in range(4)])
    groups = torch.arange(2).repeat_interleave(4)
    full = {"mask": mask, "rewards": rewards, "groups": groups}
    share = slice(rank * B // WORLD, (rank + 1) * B // WORLD)
    return full, {k: v[share] for k, v in full.items()}


def _collectives(rank):
    out = {"sum": distributed.all_sum(rank + 1, 0.5), "max": distributed.all_max(rank * 3)}
    full, mine = batch_for(rank)
    for algo in ("grpo", "rloo", "reinforce++", "reinforce++_baseline"):
        cfg = configs.Config(algo=algo, kl_coef=0.0)
        d = checks.derive(cfg)
        adv, _ = train.global_advantages(cfg, d, mine, None, None)
        ref, _ = A.advantages(algo, A.Step(full["rewards"], full["groups"], full["mask"]))
        share = slice(rank * 4, (rank + 1) * 4)
        out[algo] = float((adv - ref[share]).abs().max())
        out[algo + "_nonzero_const_group"] = int(torch.count_nonzero(adv[: 4 - 4 * rank]) if rank == 0 else 0)
        cfg = configs.Config(algo=algo, kl_coef=0.0, positive_only=True)  # the positive part, nothing else
        pos = Studies(cfg).advantages(0, [], mine, False, lambda: train.global_advantages(cfg, d, mine, None, None)).adv
        out[algo + "_positive"] = float((pos - ref[share].clamp(min=0)).abs().max())
        out[algo + "_most_negative"] = float(ref.min())  # there is something to clamp
    return out


def test_host_collectives_and_cross_rank_advantages_under_the_gpu_style_group():
    for result in spawn(_collectives, gpu_style_backend()):
        assert result["sum"] == [3.0, 1.0] and result["max"] == 3
        for algo in ("grpo", "rloo", "reinforce++", "reinforce++_baseline"):
            assert result[algo] < 1e-5 and result[algo + "_positive"] < 1e-5, (algo, result)
            assert result[algo + "_most_negative"] < -0.1, (algo, result)
        assert result["grpo_nonzero_const_group"] == 0  # the all-0.97 group sits on rank 0


def _cpu_all_reduce(rank):
    t = torch.ones(2)
    try:
        dist.all_reduce(t)
    except RuntimeError as exc:
        return str(exc)
    return "ok"


def test_an_accelerator_only_group_cannot_reduce_host_tensors():
    """The analogue of `init_process_group("nccl")`: a backend only for cuda tensors has nothing for
    the CPU tensors the trainer reduces, which is why distributed.backend routes cpu to gloo."""
    assert spawn(_cpu_all_reduce, gpu_style_backend()) == ["ok", "ok"]
    errors = spawn(_cpu_all_reduce, "cuda:gloo")
    assert all("No backend type associated with device type cpu" in e for e in errors), errors


def _modes_and_checkpointing(rank):
    from torch.distributed.device_mesh import init_device_mesh
    from transformers import AutoModelForCausalLM

    from models.tiny import tiny_model_dir

    mesh = init_device_mesh("cpu", (WORLD,))
    ids = torch.randint(0, 1000, (2, 64))
    saved = {}
    for checkpointing in (False, True):
        model = distributed.shard(AutoModelForCausalLM.from_pretrained(tiny_model_dir()), mesh, "float32", checkpointing)
        count = [0]
        with torch.autograd.graph.saved_tensors_hooks(lambda t: count.__setitem__(0, count[0] + 1) or t, lambda t: t):
            model(input_ids=ids, use_cache=False).logits.sum()
        saved[checkpointing] = count[0]
        policy_mode = model.training
    ref = distributed.shard(AutoModelForCausalLM.from_pretrained(tiny_model_dir()), mesh, "float32", False, trainable=False)
    return {"saved": saved, "policy_training": policy_mode, "ref_training": ref.training,
            "ref_grad": any(p.requires_grad for p in ref.parameters())}


@pytest.mark.parametrize("unused", [0])
def test_trained_models_train_with_checkpointing_and_the_reference_is_frozen(unused):
    for r in spawn(_modes_and_checkpointing, "gloo"):
        assert r["policy_training"] and not r["ref_training"] and not r["ref_grad"]
        # checkpointed layers keep only their inputs for backward: far fewer saved tensors
        assert r["saved"][True] < r["saved"][False] / 2, r["saved"]


def _frozen_below_top_blocks(rank):
    from torch.distributed.device_mesh import init_device_mesh
    from transformers import AutoModelForCausalLM

    from models.tiny import tiny_model_dir

    mesh = init_device_mesh("cpu", (WORLD,))
    model = distributed.shard(AutoModelForCausalLM.from_pretrained(tiny_model_dir()), mesh, "float32", False, train_layers=1)
    before = {k: v.full_tensor().clone() for k, v in model.state_dict().items()}
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    torch.manual_seed(rank)
    ids = torch.randint(0, 1000, (2, 32))
    model(input_ids=ids, use_cache=False).logits.float().logsumexp(-1).mean().backward()
    opt.step()
    after = {k: v.full_tensor() for k, v in model.state_dict().items()}
    top = f"model.layers.{len(model.model.layers) - 1}."
    return {k: not torch.equal(before[k], after[k]) for k in before}, top


def test_train_layers_updates_only_the_top_blocks_and_final_norm():
    for changed, top in spawn(_frozen_below_top_blocks, "gloo"):
        assert changed["model.norm.weight"] and all(v for k, v in changed.items() if k.startswith(top))
        frozen = [k for k in changed if not k.startswith(top) and k != "model.norm.weight"]
        assert frozen and not any(changed[k] for k in frozen), [k for k in frozen if changed[k]]


# ------------------------------------------------------------------ start-up host memory

def _peak_rss_mb() -> float:
    """This process's peak resident set since the last `_reset_peak` (VmHWM), in MB."""
    return peaks.mark() / 2**20


def _reset_peak() -> float:
    """Restart the peak-RSS count from the current RSS (infra/peaks.py); returns the current RSS in MB."""
    assert peaks.reset()
    return peaks.resident() / 2**20


def _load_peak(path, how, rank):
    from torch.distributed.device_mesh import init_device_mesh
    from transformers import AutoModelForCausalLM

    mesh = init_device_mesh("cpu", (WORLD,))
    before = _reset_peak()
    if how == "every rank reads":  # the load path before distributed.load
        model = distributed.shard(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), mesh, "float32", False)
    else:
        model = distributed.load(AutoModelForCausalLM, path, mesh, "float32", False)
    peak = _peak_rss_mb() - before
    shard_mb = sum(p.to_local().numel() * 4 for p in model.parameters()) / 2**20
    return {"peak_mb": peak, "shard_mb": shard_mb}


def test_only_rank_0_holds_a_full_copy_of_the_model_at_start_up(tmp_path):
    """Start-up host memory, measured: the peak resident-set growth of each rank while it loads a
    100M-parameter Qwen2 model (420 MB in fp32) and shards it over 2 ranks. Loaded by every rank (the old
    path), every rank peaks above the whole model; through `distributed.load`, rank 1 stays near its
    shard (half the model), and only rank 0 reads the full copy."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
                         num_key_value_heads=2, vocab_size=8192, tie_word_embeddings=False)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "m")
    full_mb = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(tmp_path / "m").parameters()) * 4 / 2**20
    old = spawn(functools.partial(_load_peak, str(tmp_path / "m"), "every rank reads"), "gloo")
    new = spawn(functools.partial(_load_peak, str(tmp_path / "m"), "rank 0 reads"), "gloo")
    print(f"\nfull model {full_mb:.0f} MB; peak RSS growth per rank, every rank reads: "
          f"{[round(r['peak_mb']) for r in old]} MB; rank 0 reads: {[round(r['peak_mb']) for r in new]} MB")
    assert all(r["peak_mb"] > full_mb for r in old)  # the measurement sees a full copy where there is one
    assert new[1]["peak_mb"] < 0.8 * full_mb, new  # its shard (half) plus a tensor or two in flight
    assert abs(new[1]["shard_mb"] - full_mb / 2) < 0.05 * full_mb


def _loaded_equals_from_pretrained(rank):
    from torch.distributed.device_mesh import init_device_mesh
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    from models.tiny import tiny_model_dir

    mesh = init_device_mesh("cpu", (WORLD,))
    out = {}
    for cls, kw in ((AutoModelForCausalLM, {}), (AutoModelForTokenClassification, {"num_labels": 1})):
        torch.manual_seed(rank)  # the critic's new head: rank 0's draw goes to every rank
        model = distributed.load(cls, tiny_model_dir(), mesh, "float32", False, **kw).eval()
        torch.manual_seed(0)
        plain = cls.from_pretrained(tiny_model_dir(), dtype=torch.float32, **kw).eval()
        mine, theirs = {k: v.full_tensor() for k, v in model.state_dict().items()}, plain.state_dict()
        buffers = dict(plain.named_buffers())
        ids = torch.randint(0, 1000, (2, 16), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            logits = float((model(input_ids=ids).logits - plain(input_ids=ids).logits).abs().max())
        out[cls.__name__] = {
            "keys": sorted(mine) == sorted(theirs),
            "weights_differ": [k for k in theirs if "score" not in k and not torch.equal(mine[k], theirs[k])],
            "buffers": all(torch.equal(b, buffers[n]) for n, b in model.named_buffers()),
            "head": mine.get("score.weight", torch.zeros(1)).tolist(),
            "logits": logits if cls is AutoModelForCausalLM else 0.0,
            "tied": getattr(model, "lm_head", model).weight is model.model.embed_tokens.weight if kw == {} else True,
            "eos": model.config.eos_token_id == plain.config.eos_token_id}
    return out


def test_a_loaded_model_equals_from_pretrained_on_every_rank():
    """distributed.load builds on the meta device and fills shards from rank 0: weights, the rotary
    buffers (outside the state dict, which `to_empty` leaves uninitialised), tied embeddings and config
    all match transformers' own load; the critic's new head is rank 0's on every rank."""
    results = spawn(_loaded_equals_from_pretrained, "gloo")
    for r in results:
        for name, v in r.items():
            assert v["keys"] and not v["weights_differ"] and v["buffers"] and v["tied"] and v["eos"], (name, v)
            assert v["logits"] == 0.0, (name, v)
    assert results[0]["AutoModelForTokenClassification"]["head"] == results[1]["AutoModelForTokenClassification"]["head"]


def _clone_with_uneven_budgets(rank):
    """warmstart.clone on both ranks, rank 0's time budget already spent, rank 1's far from it (train.py
    gives each rank the time its demonstrations left). Returns the steps each rank took."""
    from transformers import AutoModelForCausalLM

    from studies import warmstart
    from models import tiny
    from rollout import Episode

    torch.manual_seed(0)
    episodes = [Episode(task_id=i, group=i, ids=list(range(3, 23)), prompt_len=8, mask=[1] * 12,
                        logprobs=[0.0] * 12) for i in range(4)]
    model = AutoModelForCausalLM.from_pretrained(tiny.tiny_model_dir())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    budget = 1e-9 if rank == 0 else 1e6
    losses = warmstart.clone(model, optimizer, episodes, warmstart.Imitation(seconds=budget), 0,
                             warmstart.Ranks(distributed.all_sum, distributed.all_max, WORLD))
    distributed.all_sum(1.0)  # a rank still inside clone would answer this with its next step's reduction
    return len(losses)


def test_imitation_time_budget_stops_every_rank_at_the_same_step():
    """The time-matched imitation control: when one rank's budget runs out first, every rank stops at that
    step. (Before, each rank compared the slowest clock with its own budget: rank 0 left while rank 1 waited
    in its next collective, and the control's run hung.)"""
    assert spawn(_clone_with_uneven_budgets, "gloo", timeout=120) == [0, 0]
