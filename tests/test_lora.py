"""LoRA through PEFT (infra/lora.py): a 2-rank FSDP2 run trains only the adapters, its generator samples
what the trainer scores, its KL reference is the base, its checkpoint's adapters load in PEFT itself and
merge to the checkpoint's policy, and a resumed run continues exactly; the warm start folds its adapters
into the base; memplan counts the adapters PEFT creates."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from launch import checks
import config as configs
from infra import lora, memplan
from models import resolve_model

ROOT = Path(__file__).resolve().parent.parent
ARGS = ["--env", "tests.support.toy:Digits", "--engine", "hf", "--save-every", "1", "--horizon", "2", "--tasks-per-step", "2",
        "--samples-per-task", "4", "--max-tokens", "6", "--seed", "5", "--lora-rank", "4", "--lora-alpha", "8",
        "--kl-coef", "0.05", "--lr", "0.01"]


def launch(out, *extra, nproc=2):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--standalone", "train.py",
           *ARGS, "--out", str(out), *extra]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={k: v for k, v in os.environ.items() if k != "TRAIN_FAULT"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]


def merged_by_peft(adapter_dir: Path) -> dict:
    """The base with a saved adapter merged, by PEFT's own code (an independent check of lora.hf_tensors)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(resolve_model("tiny"), dtype=torch.float32)
    return PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload().state_dict()


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["full", "sharded"])
def test_two_ranks_train_only_adapters_on_policy_and_resume_exactly(tmp_path, fmt):
    run, cut = tmp_path / "run", tmp_path / "cut"
    rows = launch(run, "--steps", "3", "--checkpoint-format", fmt)
    assert rows[0]["kl"] == 0.0 and rows[-1]["kl"] > 0  # the reference is the base: the policy until it moves
    assert all(r["sampler_gap"] < 1e-4 for r in rows)  # merged weights reached the generator every step
    ckpt = run / "checkpoints" / "step_000003"
    policy, adapter = load_file(ckpt / "policy" / "model.safetensors"), load_file(ckpt / "adapter" / lora.ADAPTER_FILE)
    assert not any(".lora_" in k or "base_layer" in k for k in policy)  # a plain model of the base's names
    assert max(float(t.abs().max()) for k, t in adapter.items() if "lora_B" in k) > 0  # the adapters moved
    peft_merged = merged_by_peft(ckpt / "adapter")
    assert all(torch.allclose(policy[k], peft_merged[k], atol=1e-6) for k in policy)
    base = load_file(Path(resolve_model("tiny")) / "model.safetensors")
    assert any(not torch.equal(policy[k], base[k]) for k in policy if k in base)
    if fmt == "full":  # the optimizer holds the adapters alone
        optim = torch.load(ckpt / "optim_policy.pt", weights_only=True)
        assert len(optim["state"]) == len(adapter) and all(".lora_" in k for k in optim["state"])

    shutil.copytree(run, cut)  # as if killed during the last step: its checkpoint and row gone
    shutil.rmtree(cut / "checkpoints" / "step_000003")
    (cut / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:2]))
    resumed = launch(cut, "--steps", "3", "--checkpoint-format", fmt, "--resume")
    plain = lambda r: {k: v for k, v in r.items() if not k.startswith(("time/", "mem/"))}  # noqa: E731
    assert plain(resumed[-1]) == plain(rows[-1])
    again = load_file(cut / "checkpoints" / "step_000003" / "adapter" / lora.ADAPTER_FILE)
    assert all(torch.equal(again[k], adapter[k]) for k in adapter)


@pytest.mark.slow
def test_the_warm_start_folds_its_adapters_into_the_reference(tmp_path):
    """BabyAI's expert imitated through adapters: after the warm start the reference (adapters off) is the
    warm start, so the first RL step's KL is 0; the saved warm start differs from the base."""
    cmd = [sys.executable, "train.py", "--env", "babyai", "--engine", "hf", "--bc-episodes", "4", "--bc-lr", "0.01",
           "--steps", "1", "--horizon", "2", "--tasks-per-step", "2", "--samples-per-task", "2", "--max-tokens", "8",
           "--lora-rank", "4", "--kl-coef", "0.1", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (row,) = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert row["kl"] == 0.0
    warm, base = load_file(tmp_path / "warmstart" / "model.safetensors"), load_file(
        Path(resolve_model("tiny")) / "model.safetensors")
    assert any(not torch.equal(warm[k], base[k]) for k in base if "proj" in k)
    assert not any(".lora_" in k for k in warm)


def test_memplan_counts_the_adapters_peft_creates():
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = memplan.model_config("smollm2")
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**fields))
    lora.inject(model, lora.config(16, 32.0, 0.0, lora.TARGETS))
    made = sum(p.numel() for n, p in model.named_parameters() if ".lora_" in n)
    s = memplan.shape(fields)
    assert lora.param_count(s, 16, lora.TARGETS) == made
    full = memplan.plan(s, 2, "float32", False, 2048, kl=True, engine="hf", device="cpu")["train"]
    small = memplan.plan(s, 2, "float32", False, 2048, kl=True, engine="hf", device="cpu", adapters=made)["train"]
    assert small["AdamW moments (fp32)"] == 8 * made / 2 and small["reference model (sharded)"] == 0
    assert sum(small.values()) < sum(full.values())


def test_the_adapters_config_is_read_from_the_model_and_folding_names_a_new_base(tmp_path):
    """One record of the adapters: the LoraConfig PEFT keeps on the model. Folding them into the base (the warm
    start) names the new base in a new config, the old one left as it was, and a saved adapter says so."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(resolve_model("tiny"), dtype=torch.float32)
    asked = lora.config(4, 8.0, 0.0, lora.TARGETS, "the-base")
    lora.inject(model, asked)
    assert lora.config_of(model) is asked
    lora.fold_into_base(model, "the-warm-start")
    assert asked.base_model_name_or_path == "the-base"
    assert lora.config_of(model).base_model_name_or_path == "the-warm-start" and lora.config_of(model).r == 4
    lora.save_adapter(tmp_path / "adapter", model, rank=0)
    saved = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert saved["base_model_name_or_path"] == "the-warm-start" and saved["target_modules"] == sorted(asked.target_modules)


@pytest.mark.parametrize("flags, message", [
    (["--train-layers", "1"], "--lora-rank and --train-layers are two ways"),
    (["--lora-targets", "q_proj,wq"], "--lora-targets: wq not a linear layer"),
    (["--lora-dropout", "1.5"], "--lora-dropout in [0, 1)"),
])
def test_a_broken_lora_flag_is_one_line_naming_the_fix(flags, message):
    cfg = configs.parse(["--model", "tiny", "--lora-rank", "4", *flags])
    assert message in (checks.check(cfg, 1) or "")
