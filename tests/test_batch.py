"""batch.forward computes logprobs and entropy through the LM head in bounded slices: it must equal
the naive full-logits computation (values and gradients, fp32 and bf16), and its peak memory must stay
bounded where the naive path's grows with tokens x vocabulary (the out-of-memory kill of a real model)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

import batch as B
from infra import memplan, passes
from models.tiny import tiny_model_dir
from tests.support.one_rank import one_rank  # noqa: F401 (a fixture)


ROOT = Path(__file__).resolve().parent.parent


def naive(model, ids, attn, temperature):
    """The reference: whole (b, w, V) logits in float32, as the trainer computed them before."""
    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float() / temperature
    lp = logits.gather(-1, ids[:, 1:, None]).squeeze(-1) - logits.logsumexp(-1)
    probs = logits.softmax(-1)
    return lp, logits.logsumexp(-1) - (probs * logits).sum(-1)


@pytest.fixture(scope="module")
def peaked():
    """The tiny model with its final norm scaled x30, so logits are far from flat (std about 5)."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir(), dtype=torch.float32)
    with torch.no_grad():
        model.model.norm.weight.mul_(30)
    ids = torch.randint(0, model.config.vocab_size, (3, 40))
    attn = torch.ones_like(ids)
    attn[1, 30:] = 0
    return model, {"ids": ids, "attn": attn}


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_sliced_head_equals_naive_values_and_gradients(peaked, temperature, fused, monkeypatch):
    """Both heads, the plain one (checkpointed slices) and the fused one (batch._Head, its own backward)."""
    model, batch = peaked
    monkeypatch.setattr(passes, "LOGIT_ELEMENTS", 7 * model.config.vocab_size)  # 7-token slices: many of them
    weights = torch.rand(3, 39, generator=torch.Generator().manual_seed(1))
    lp, ent = B.forward(model, batch, [0, 1, 2], temperature, entropy="grad", fast=B.Fast(fused_head=fused))
    ref_lp, ref_ent = naive(model, batch["ids"], batch["attn"], temperature)
    assert lp.dtype == torch.float32 and torch.equal(lp[:, 0], torch.zeros(3))
    torch.testing.assert_close(lp[:, 1:], ref_lp, rtol=0, atol=1e-4)
    torch.testing.assert_close(ent[:, 1:], ref_ent, rtol=0, atol=1e-4)
    params = list(model.parameters())
    got = torch.autograd.grad((lp[:, 1:] * weights).sum() + ent[:, 1:].sum(), params)
    want = torch.autograd.grad((ref_lp * weights).sum() + ref_ent.sum(), params)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4 * float(w.abs().max()))


@pytest.mark.parametrize("fused", [False, True])
def test_entropy_is_a_detached_metric_unless_asked(peaked, fused):
    model, batch = peaked
    lp, ent = B.forward(model, batch, [0, 2], 1.0, entropy="detached", fast=B.Fast(fused_head=fused))
    assert lp.requires_grad and not ent.requires_grad
    _, ent = B.forward(model, batch, [0, 2], 1.0, entropy="grad", fast=B.Fast(fused_head=fused))
    assert ent.requires_grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_head_equals_the_plain_one_under_a_frozen_head(peaked, dtype, monkeypatch):
    """--fused-head against the plain path where it differs most: a frozen (tied) head, as under
    --train-layers, whose hidden-state gradient the fused head makes in forward. Values and gradients."""
    model, batch = peaked
    monkeypatch.setattr(passes, "LOGIT_ELEMENTS", 5 * model.config.vocab_size)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir(), dtype=dtype)
    model.load_state_dict({k: v.to(dtype) for k, v in peaked[0].state_dict().items()})
    model.get_output_embeddings().weight.requires_grad_(False)
    weights = torch.rand(3, 40, generator=torch.Generator().manual_seed(2))
    out = {}
    for fused in (False, True):
        lp, ent = B.forward(model, {**batch, "mask": (batch["attn"] > 0).float()}, [0, 1, 2], 0.8, entropy="grad",
                            policy_only=True, fast=B.Fast(fused_head=fused))
        params = [p for p in model.parameters() if p.requires_grad]
        out[fused] = (lp, ent, torch.autograd.grad((lp * weights).sum() + ent.sum(), params))
    (plp, pent, pgrad), (flp, fent, fgrad) = out[False], out[True]
    tol = 1e-5 if dtype == torch.float32 else 0.05
    torch.testing.assert_close(flp, plp, rtol=0, atol=tol)
    torch.testing.assert_close(fent, pent, rtol=0, atol=tol)
    for f, p in zip(fgrad, pgrad):
        scale = float(p.float().abs().max())
        torch.testing.assert_close(f.float(), p.float(), rtol=0, atol=(1e-4 if dtype == torch.float32 else 0.06) * scale + 1e-7)
    assert any(float(p.abs().max()) > 0 for p in pgrad)


def test_bf16_model_gives_float32_logprobs_close_to_naive(peaked):
    model, batch = peaked
    bf16 = AutoModelForCausalLM.from_pretrained(tiny_model_dir(), dtype=torch.bfloat16)
    bf16.load_state_dict({k: v.to(torch.bfloat16) for k, v in model.state_dict().items()})
    lp, ent = B.forward(bf16, batch, [0, 1, 2], 1.0, entropy="detached")
    ref_lp, ref_ent = naive(bf16, batch["ids"], batch["attn"], 1.0)
    assert lp.dtype == torch.float32 and ent.dtype == torch.float32
    torch.testing.assert_close(lp[:, 1:], ref_lp, rtol=0, atol=0.05)   # bf16 matmul order differs
    with torch.no_grad():
        score = B.score(bf16, {**batch, "mask": torch.zeros(3, 40)}, [[0, 1], [2]], 1.0)
    torch.testing.assert_close(score[:, 1:], ref_lp.detach(), rtol=0, atol=0.05)


PEAK = r"""
import json, resource, sys, torch
sys.path.insert(0, {root!r})
from transformers import Qwen2Config, Qwen2ForCausalLM
import batch as B
from infra import memplan
torch.manual_seed(0)
model = Qwen2ForCausalLM(Qwen2Config(vocab_size=131072, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                     num_attention_heads=1, num_key_value_heads=1, tie_word_embeddings=True))
ids = torch.randint(0, 131072, (4, 512))
batch = {{"ids": ids, "attn": torch.ones_like(ids), "mask": torch.ones(4, 512)}}
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
if {naive}:
    logits = model(input_ids=ids).logits[:, :-1].float()
    lp = logits.gather(-1, ids[:, 1:, None]).squeeze(-1) - logits.logsumexp(-1)
    ent = logits.logsumexp(-1) - (logits.softmax(-1) * logits).sum(-1)
    (lp.sum() + ent.sum()).backward()
else:
    B.score(model, batch, [[0, 1], [2, 3]], 1.0)
    lp, ent = B.forward(model, batch, [0, 1, 2, 3], 1.0, entropy="detached")
    lp.sum().backward()
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({{"peak_mb": (after - before) / 1024}}))
"""


def peak_mb(naive_path: bool) -> float:
    code = PEAK.format(root=str(ROOT), naive=naive_path)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])["peak_mb"]


def test_large_vocabulary_peak_memory_is_bounded():
    """2,044 scored tokens x 131,072 vocabulary: one float32 logits tensor is 1 GB. The sliced path
    (score, then forward + backward) must stay under 500 MB above its start. The naive path, what the
    trainer did before, holds that 1 GB tensor (and its softmax) at once, so it cannot pass the bound
    (`peak_mb(True)` measures it; not run here, it only costs time)."""
    sliced = peak_mb(False)
    assert sliced < 500, f"sliced head peaked at {sliced:.0f} MB"


def two_turn_batch(vocab: int, rows: int = 4) -> dict:
    """`rows` random two-turn episodes of 30, 35, ... tokens, two to a group."""
    from rollout import Episode

    episodes = []
    for i in range(rows):
        ids = torch.randint(0, vocab, (30 + 5 * i,)).tolist()
        ep = Episode(i, i // 2, ids[:10], 10)
        ep.append(ids[10:20], True, [-1.0] * 10)
        ep.append(ids[20:], False)
        episodes.append(ep)
    return B.collate(episodes, 0)


def test_rows_with_zero_advantage_are_skipped_without_changing_the_update(one_rank):
    """train.update skips the forward/backward of rows whose advantage is 0 everywhere (GRPO's constant
    groups) when nothing else touches them: the parameters after the step equal the unskipped run's."""
    import copy

    import config as configs
    import train

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir(), dtype=torch.float32)
    batch = two_turn_batch(base.config.vocab_size)
    adv = batch["mask"] * torch.tensor([0.0, 0.0, 1.5, -0.5])[:, None]      # rows 0, 1: a constant group
    cfg = configs.Config(kl_coef=0.0, micro_tokens=64)
    results = []
    for force_all in (False, True):
        model = copy.deepcopy(base)
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        # a reference at zero KL weight changes no gradient but makes every row "touched": no skipping
        ref = B.score(model, batch, [[0, 1, 2, 3]], 1.0) if force_all else None
        stats = train.update(cfg, {"policy": model}, {"policy": opt}, train.Scored(batch, adv, adv, ref=ref))
        results.append((model, stats["skipped_rows"]))
    (skipping, skipped), (full, none_skipped) = results
    assert skipped == 2 and none_skipped == 0
    for p, q in zip(skipping.parameters(), full.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    assert any(not torch.equal(p, q) for p, q in zip(skipping.parameters(), base.parameters()))


def test_held_back_gradients_add_up_to_one_step_on_both_batches(one_rank):
    """--min-groups: update(apply=False) leaves the weights as they were and keeps its gradients; the next
    update(apply=True) steps on the sum of both batches' gradients, each taken at the same weights."""
    import copy

    import config as configs
    import train

    torch.manual_seed(1)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir(), dtype=torch.float32)
    batches = [two_turn_batch(base.config.vocab_size) for _ in range(2)]
    advs = [b["mask"] * torch.tensor(a)[:, None] for b, a in zip(batches, ([1.0, -1.0, 0.5, -0.5], [0.0, 0.0, 2.0, -1.0]))]
    cfg = configs.Config(kl_coef=0.0, micro_tokens=64, grad_clip=1e9)  # clipping would scale each run its own way

    def run(steps):  # [(batch index, apply)] with plain SGD at lr 1: the weights move by minus the gradient
        model = copy.deepcopy(base)
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        for i, apply in steps:
            train.update(cfg, {"policy": model}, {"policy": opt}, train.Scored(batches[i], advs[i], advs[i]),
                         apply=apply)
            if not apply:  # held back: unchanged weights, gradients kept for the next step
                assert all(torch.equal(p, q) for p, q in zip(model.parameters(), base.parameters()))
                assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
        return model

    pooled, first, second = run([(0, False), (1, True)]), run([(0, True)]), run([(1, True)])
    for b, p, q, r in zip(base.parameters(), pooled.parameters(), first.parameters(), second.parameters()):
        torch.testing.assert_close(b - p, (b - q) + (b - r), rtol=1e-4, atol=1e-6)
    assert any(not torch.equal(p, b) for p, b in zip(pooled.parameters(), base.parameters()))


def test_an_update_with_only_constant_groups_leaves_weights_and_adam_state_unchanged(one_rank):
    """After a real AdamW step, a batch whose every group is constant (advantage 0 everywhere) has an
    exactly-zero gradient; Adam would still move every weight by its momentum. train.update must leave
    the weights, the optimizer's step count and the schedule as they were, and count the idle step."""
    import copy

    import config as configs
    import train

    for dtype in (torch.float32, torch.bfloat16):
        torch.manual_seed(2)
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir(), dtype=dtype)
        batch = two_turn_batch(model.config.vocab_size)
        cfg = configs.Config(kl_coef=0.0, micro_tokens=64)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 4))
        informative = batch["mask"] * torch.tensor([1.0, -1.0, 1.5, -0.5])[:, None]
        stats = train.update(cfg, {"policy": model}, {"policy": opt}, train.Scored(batch, informative, informative),
                             {"policy": sched})
        assert stats["idle_steps"] == 0
        before = copy.deepcopy(model.state_dict())
        steps, lr = opt.state[next(iter(model.parameters()))]["step"].item(), sched.get_last_lr()[0]
        constant = batch["mask"] * 0.0
        stats = train.update(cfg, {"policy": model}, {"policy": opt}, train.Scored(batch, constant, constant),
                             {"policy": sched})
        assert stats["idle_steps"] == 1 and stats["skipped_rows"] == 4 and stats["grad_norm"] == 0.0
        for k, v in model.state_dict().items():
            assert torch.equal(v, before[k]), k
        assert opt.state[next(iter(model.parameters()))]["step"].item() == steps == 1
        assert sched.get_last_lr()[0] == lr
        # the next informative batch steps again
        stats = train.update(cfg, {"policy": model}, {"policy": opt}, train.Scored(batch, informative, informative),
                             {"policy": sched})
        assert stats["idle_steps"] == 0 and opt.state[next(iter(model.parameters()))]["step"].item() == 2


def test_each_training_reward_and_the_success_bonus():
    """SciWorld's three endings: a wrong answer after some progress (-1, best 0.4), turns run out at 0.3 after
    reaching 0.5 (a score can fall), a success. The env's own reward is what evaluation records."""
    from rollout import Episode
    eps = [Episode(0, 0, [1, 2], 1, [1], [0.0], reward=r, best=b, success=s)
           for r, b, s in ((-1.0, 0.4, False), (0.3, 0.5, False), (1.0, 1.0, True))]
    want = {"env": [-1.0, 0.3, 1.0], "progress": [0.0, 0.3, 1.0], "best": [0.4, 0.5, 1.0]}
    for kind, rewards in want.items():
        for bonus in (0.0, 1.0):
            got = B.collate(eps, 0, reward=kind, success_bonus=bonus)["rewards"].tolist()
            assert got == pytest.approx([r + bonus * (i == 2) for i, r in enumerate(rewards)]), (kind, bonus)
    assert [e.reward for e in eps] == [-1.0, 0.3, 1.0]  # untouched


def test_logged_per_token_statistics_are_means_over_the_tokens_they_were_computed_on(one_rank):
    """Half the rows skipped (a constant group, no KL): the logged entropy is the mean over the trained rows'
    policy tokens, and clip_frac the share of those tokens that were clipped. Dividing by every row's tokens,
    skipped ones included, halved both (metrics.jsonl's entropy before this test)."""
    import config as configs
    import train

    torch.manual_seed(3)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir(), dtype=torch.float32)
    batch = two_turn_batch(model.config.vocab_size)
    adv = batch["mask"] * torch.tensor([0.0, 0.0, 1.5, -0.5])[:, None]     # rows 0, 1: skipped
    cfg = configs.Config(kl_coef=0.0, micro_tokens=64)
    with torch.no_grad():
        _, ent = B.forward(model, batch, [2, 3], cfg.temperature, entropy="detached")
        old = B.score(model, batch, [[0, 1, 2, 3]], cfg.temperature) - 0.5   # ratio e^0.5: clipped where A > 0
    m = batch["mask"][[2, 3], :ent.shape[1]].double()
    want_entropy = float((ent.double() * m).sum() / m.sum())
    want_clip = float(m[0].sum() / m.sum())                                # row 2's tokens (A > 0) of rows 2, 3
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    stats = train.update(cfg, {"policy": model}, {"policy": opt}, train.Scored(batch, adv, adv, old=old))
    assert stats["skipped_rows"] == 2 and want_clip == 0.5
    assert stats["entropy"] == pytest.approx(want_entropy, rel=1e-5)
    assert stats["clip_frac"] == pytest.approx(want_clip, rel=1e-6)
