"""The shared-prefix update (infra/prefix.py) is exact: its logprobs, loss and gradients equal the plain padded
computation's, float32 (tight) and bfloat16 (bf16 rounding), for every estimator, with and without
activation checkpointing, in one process and under FSDP2 on 2 gloo ranks. Also: the packed layout
rebuilds every row, the group-aware micro-batches respect their budget, and the sliced LM head's custom
backward equals autograd's (its bf16 weight gradient summed in float32, closer to an fp32 reference)."""
import copy

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForTokenClassification, LlamaConfig, LlamaForCausalLM

import algorithms as A
import batch as B
import config as configs
import losses
from infra import passes as P
from infra import prefix
import train
from rollout import Episode
from models.tiny import tiny_model_dir
from tests.support.one_rank import one_rank  # noqa: F401 (a fixture)


def episodes(vocab: int, seed: int = 0, groups: int = 3, size: int = 4) -> list[Episode]:
    """Groups of multi-turn episodes whose members share their prompt token for token (as rollout.py
    builds them); one episode stops after its prompt and one reply, one is an env error (mask zeroed)."""
    g = torch.Generator().manual_seed(seed)
    rand = lambda n: torch.randint(3, vocab, (n,), generator=g).tolist()  # noqa: E731
    out = []
    for k in range(groups):
        prompt = rand(9 + 4 * k)
        for i in range(size):
            ep = Episode(k, k, list(prompt), len(prompt))
            for turn in range(1 + (i + k) % 3):
                n = 3 + (i * 5 + turn * 3 + k) % 6
                ep.append(rand(n), True, [-1.0] * n)
                if turn < (i + k) % 3:
                    ep.append(rand(2 + (i + turn) % 4), False)
            ep.reward = float((i + k) % 3 == 0) - 0.3 * i
            ep.end = "env_error" if (k, i) == (1, 2) else "done"
            out.append(ep)
    return out


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir(), dtype=torch.float32)


def test_layout_rebuilds_every_row_and_shares_the_common_prefix():
    ids = torch.tensor([[5, 6, 7, 8, 9, 0], [5, 6, 7, 1, 2, 3], [5, 6, 4, 0, 0, 0], [9, 9, 9, 9, 0, 0]])
    lengths = torch.tensor([5, 6, 3, 4])
    lay = prefix.layout(ids, lengths, torch.tensor([0, 0, 0, 1]))
    # group 0 shares [5, 6] once; row 3 stands alone: its prefix is all but its last token
    assert lay.ids.shape[1] == 2 + 3 + 4 + 1 + 3 + 1
    for r in range(4):
        assert torch.equal(lay.ids[0, lay.where[r]], ids[r, :lengths[r]])
        assert torch.equal(lay.positions[0, lay.where[r]], torch.arange(int(lengths[r])))
    assert prefix.common_prefix(ids[:2], lengths[:2]) == 3 and prefix.common_prefix(ids[:1], lengths[:1]) == 4
    assert [(rows.tolist(), g, p) for rows, g, p in lay.parts] == [([0, 1, 2], 0, 2), ([3], 1, 3)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_unmasked_tail_attention_equals_the_masked_one(dtype):
    """TailAttention (two flash calls merged by log-sum-exp, the kernel's backward per part) against one
    masked SDPA over [prefix, own] keys in float64: groups of unequal prefixes (the shorter one padded),
    one group of an empty prefix; outputs and all five gradients. In bf16 its error is at most the masked
    bf16 call's own error (+ one bf16 rounding)."""
    g = torch.Generator().manual_seed(0)
    R, G, P, C, h, d = 6, 3, 7, 9, 4, 8
    owner, starts = [0, 0, 0, 1, 1, 2], [7, 4, 0]
    x64 = [torch.randn(shape, generator=g, dtype=torch.float64) for shape in
           [(R, h, C, d), (G, h, P, d), (G, h, P, d), (R, h, C, d), (R, h, C, d)]]
    grad = torch.randn(R, h, C, d, generator=g, dtype=torch.float64)
    own = torch.tensor(owner)
    seen = torch.arange(P)[None, :] < torch.tensor(starts)[own][:, None]
    causal = torch.ones(C, C, dtype=torch.bool).tril()
    mask = torch.cat([seen[:, None, None, :].expand(-1, 1, C, P), causal.expand(R, 1, C, C)], -1)

    def masked(q, kp, vp, kt, vt):
        keys, values = torch.cat([kp[own], kt], 2), torch.cat([vp[own], vt], 2)
        return torch.nn.functional.scaled_dot_product_attention(q, keys, values, attn_mask=mask)

    def run(fn, xs):
        xs = [x.detach().requires_grad_() for x in xs]
        out = fn(*xs)
        return [out, *torch.autograd.grad(out, xs, grad.to(out.dtype))]

    ref = run(masked, x64)
    parts = [(torch.tensor([0, 1, 2]), 0, 7), (torch.tensor([3, 4]), 1, 4)]  # group 2 has no prefix: no part
    ours = run(lambda *xs: prefix.TailAttention.apply(*xs, parts, None), [x.to(dtype) for x in x64])
    theirs = run(masked, [x.to(dtype) for x in x64])
    for a, b, r in zip(ours, theirs, ref):
        err, base = (a.double() - r).abs().max().item(), (b.double() - r).abs().max().item()
        assert err <= (1e-5 if dtype == torch.float32 else base + 2 ** -8 * r.abs().max().item()), (err, base)
    assert ours[0].dtype == dtype and all(a.dtype == dtype for a in ours[1:])


def test_group_micro_batches_cover_every_row_once_within_the_budget(tiny):
    batch = B.collate(episodes(tiny.config.vocab_size, groups=4), 0)
    rows = [r for r in range(16) if r != 5]
    for budget in (40, 90, 400):
        micro = P.micro_batches(rows, batch["attn"].sum(1), budget, batch)
        assert sorted(r for mb in micro for r in mb) == rows
        for mb in micro:  # a micro-batch may pass the budget only as one row that alone exceeds it
            total = sum(prefix.cost(batch, g) for g in prefix.groups_of(mb, batch["groups"]))
            assert total <= budget or len(mb) == 1, (budget, mb, total)
    # a budget that holds a whole group keeps it together: one prefix per group and micro-batch
    micro = P.micro_batches(rows, batch["attn"].sum(1), 400, batch)
    assert all(len({int(batch["groups"][r]) for r in mb}) == len(prefix.groups_of(mb, batch["groups"])) for mb in micro)
    assert len(micro) < len(P.micro_batches(rows, batch["attn"].sum(1), 400))


def smollm2_shaped():
    """SmolLM2-135M's shapes (hidden 576, 9 heads over 3 key/value heads, vocabulary 49,152, tied head),
    2 random blocks instead of 30."""
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=2,
                                        num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True,
                                        attn_implementation="sdpa"))


@pytest.mark.parametrize("shape", ["tiny", "smollm2"])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_shared_prefix_forward_equals_the_plain_one(tiny, shape, checkpointing):
    model = copy.deepcopy(tiny) if shape == "tiny" else smollm2_shaped()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    batch = B.collate(episodes(model.config.vocab_size, groups=2), 0)
    rows = [0, 1, 3, 4, 5, 6]  # a group split: row 2 absent, row 3 shares with 0 and 1
    weights = torch.rand(len(rows), batch["ids"].shape[1], generator=torch.Generator().manual_seed(1))
    got = {}
    for shared in (True, False, True):  # plain after shared: the switched attention still serves plain calls
        lp, ent = B.forward(model, batch, rows, 0.7, entropy="grad", fast=B.Fast(shared_prefix=shared))
        real = batch["attn"][rows, :lp.shape[1]].float()
        params = [p for p in model.parameters()]
        grads = torch.autograd.grad(((lp * weights[:, :lp.shape[1]] + ent) * real).sum(), params)
        got.setdefault(shared, []).append((lp * real, ent * real, grads))
    assert model.config._attn_implementation == prefix.NAME
    for one in got[True]:
        for a, b in zip(one, got[False][0]):
            for x, y in zip(a if isinstance(a, tuple) else [a], b if isinstance(b, tuple) else [b]):
                torch.testing.assert_close(x, y, rtol=1e-4, atol=2e-5 * max(1.0, float(y.detach().abs().max())))


class Recorder:
    """An optimizer that keeps the gradients it is handed (train.update steps it once per mini-batch)."""

    def __init__(self, model):
        self.params, self.grads = list(model.parameters()), []

    def step(self):
        self.grads.append([p.grad.clone() if p.grad is not None else None for p in self.params])

    def zero_grad(self, set_to_none=True):
        for p in self.params:
            p.grad = None


def run_update(algo: str, dtype, checkpointing: bool, shared: bool, base, critic_base, vocab: int) -> dict:
    """train.update on one process for `algo`; the inputs (old/ref logprobs, values) are scored once by
    the plain path and shared by both runs."""
    cfg = configs.Config(algo=algo, kl_coef=0.05, entropy_coef=0.01 if algo == "grpo" else 0.0, micro_tokens=64,
                         grad_clip=1e9, shared_prefix=shared, checkpointing=checkpointing,
                         mini_batches=2 if algo == "rloo" else 1)
    batch = B.collate(episodes(vocab), 0)
    mask, rewards, groups = batch["mask"], batch["rewards"], batch["groups"]
    micro = [list(range(6)), list(range(6, 12))]
    models = {"policy": copy.deepcopy(base).to(dtype)}
    if algo == "ppo":
        models["critic"] = copy.deepcopy(critic_base).to(dtype)
        models["critic"].dropout.p = 0.0  # transformers' token classifier drops 10% of its input in train mode
    for m in models.values():
        if checkpointing:
            m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        m.train()
    ref_model = copy.deepcopy(base).to(dtype).eval()
    ref_lp = B.score(ref_model, batch, micro, 1.0) + 0.1 * mask  # a reference a little off the policy
    old = None if algo == "grpo" else B.score(models["policy"], batch, micro, 1.0) - 0.05 * mask
    values = B.score(models["critic"], batch, micro, 1.0, value=True) if algo == "ppo" else None
    kl_in_reward = algo == "reinforce++"
    token_kl = losses.kl_penalty(old, ref_lp, "k3") * mask if kl_in_reward else None
    adv, returns = A.advantages("gae" if algo == "ppo" else algo, A.Step(rewards, groups, mask, values, token_kl),
                                A.Options(kl_coef=cfg.kl_coef if kl_in_reward else 0.0))
    opts = {k: Recorder(m) for k, m in models.items()}
    scored = train.Scored(batch, adv, returns, old, None if kl_in_reward else ref_lp, values, kl_in_reward)
    stats = train.update(cfg, models, opts, scored)
    return {"stats": stats, "grads": {k: o.grads for k, o in opts.items()}}


@pytest.mark.parametrize("algo", ["grpo", "rloo", "reinforce++", "ppo"])
@pytest.mark.parametrize("dtype, checkpointing", [(torch.float32, False), (torch.float32, True),
                                                  (torch.bfloat16, False), (torch.bfloat16, True)])
def test_shared_prefix_update_has_the_plain_gradient(tiny, algo, dtype, checkpointing, one_rank):
    critic = AutoModelForTokenClassification.from_pretrained(tiny_model_dir(), num_labels=1, dtype=torch.float32)
    runs = [run_update(algo, dtype, checkpointing, shared, tiny, critic, tiny.config.vocab_size)
            for shared in (True, False)]
    fp32 = dtype == torch.float32
    for key in ("loss", "kl", "entropy", "value_loss"):
        want = runs[1]["stats"][key]
        assert abs(runs[0]["stats"][key] - want) <= (1e-5 if fp32 else 2e-2) * max(1.0, abs(want)), key
    for name, steps in runs[1]["grads"].items():
        assert len(steps) == (2 if algo == "rloo" else 1)
        for got_step, want_step in zip(runs[0]["grads"][name], steps):
            assert any(w is not None and w.abs().max() > 0 for w in want_step)
            for got, want in zip(got_step, want_step):
                assert (got is None) == (want is None)
                if want is None:
                    continue
                scale = float(want.float().abs().max())
                # bf16: two orders of summation, each rounded to 8 bits, through the whole network
                tol = 2e-5 * scale if fp32 else 0.06 * scale + 1e-6
                torch.testing.assert_close(got.float(), want.float(), rtol=0, atol=tol, msg=f"{algo} {name}")


@pytest.mark.parametrize("frozen", [True, False])
def test_sliced_head_backward_equals_autograd(frozen):
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(50, 16, generator=g, requires_grad=True)
    weight = (torch.randn(300, 16, generator=g) * 2).requires_grad_(not frozen)
    targets = torch.randint(0, 300, (50,), generator=g)
    up_lp, up_ent = torch.randn(50, generator=g), torch.randn(50, generator=g)
    lp, ent = B.head_logprobs(hidden, weight, targets, 0.7, entropy=True, entropy_grad=True, slice_tokens=7)
    z = (hidden @ weight.T) / 0.7
    ref_lp = z.log_softmax(-1).gather(-1, targets[:, None]).squeeze(-1)
    ref_ent = -(z.softmax(-1) * z.log_softmax(-1)).sum(-1)
    torch.testing.assert_close(lp, ref_lp, rtol=0, atol=1e-5)
    torch.testing.assert_close(ent, ref_ent, rtol=0, atol=1e-5)
    inputs = [hidden] if frozen else [hidden, weight]
    got = torch.autograd.grad((lp * up_lp).sum() + (ent * up_ent).sum(), inputs)
    want = torch.autograd.grad((ref_lp * up_lp).sum() + (ref_ent * up_ent).sum(), inputs)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_bf16_head_weight_gradient_is_summed_in_float32():
    """Under bf16, the head's weight gradient over ~150 slices: summed in float32 (ours) against the
    float64 truth, it is several times closer than autograd's own sum of bf16 slice gradients."""
    g = torch.Generator().manual_seed(0)
    n, slices, H, V = 4, 150, 32, 512
    hidden = torch.randn(n * slices, H, generator=g).bfloat16().requires_grad_(True)
    weight = (torch.randn(V, H, generator=g) * 0.3).bfloat16().requires_grad_(True)
    targets = torch.randint(0, V, (n * slices,), generator=g)
    lp, _ = B.head_logprobs(hidden, weight, targets, 1.0, slice_tokens=n)
    (ours,) = torch.autograd.grad(lp.sum(), [weight])
    parts = []  # what autograd sums when every slice is its own bf16 graph (the checkpointed slices did)
    for i in range(0, n * slices, n):
        z = (hidden[i:i + n] @ weight.T).float()
        parts.append(z.log_softmax(-1).gather(-1, targets[i:i + n, None]).sum())
    (bf16_sum,) = torch.autograd.grad(torch.stack(parts).sum(), [weight])
    h64, w64 = hidden.detach().double().requires_grad_(True), weight.detach().double().requires_grad_(True)
    (truth,) = torch.autograd.grad((h64 @ w64.T).log_softmax(-1).gather(-1, targets[:, None]).sum(), [w64])
    err = lambda x: float((x.double() - truth).norm() / truth.norm())  # noqa: E731
    assert err(ours) < 0.01 and err(ours) * 3 < err(bf16_sum), (err(ours), err(bf16_sum))


def _fsdp2_update(rank):
    """train.update under FSDP2 on this rank's share (groups split over the ranks), with and without
    the shared prefix, float32 and bf16 mixed precision, checkpointing on: loss and full gradients."""
    from torch.distributed.device_mesh import init_device_mesh

    from infra import distributed

    mesh = init_device_mesh("cpu", (2,))
    out = {}
    for dtype in ("float32", "bfloat16"):
        for shared in (True, False):
            model = distributed.shard(AutoModelForCausalLM.from_pretrained(tiny_model_dir()), mesh, dtype, True)
            eps = episodes(model.config.vocab_size)[rank * 6:(rank + 1) * 6]
            batch = B.collate(eps, 0)
            adv, _ = A.advantages("grpo", A.Step(batch["rewards"], batch["groups"], batch["mask"]))
            cfg = configs.Config(kl_coef=0.0, entropy_coef=0.01, micro_tokens=48 + 32 * rank, grad_clip=1e9,
                                 shared_prefix=shared)
            rec = Recorder(model)
            stats = train.update(cfg, {"policy": model}, {"policy": rec}, train.Scored(batch, adv, adv))
            out[dtype, shared] = (stats["loss"], [g.full_tensor() for g in rec.grads[0]])
    result = {}
    for dtype in ("float32", "bfloat16"):
        (loss_s, grads_s), (loss_p, grads_p) = out[dtype, True], out[dtype, False]
        result[dtype] = (abs(loss_s - loss_p), max(float((a - b).abs().max() / b.abs().max())
                                                   for a, b in zip(grads_s, grads_p)))
    return result


def test_shared_prefix_update_under_fsdp2_has_the_plain_gradient():
    from tests.test_distributed import spawn

    for result in spawn(_fsdp2_update, "gloo"):
        assert result["float32"][0] < 1e-6 and result["float32"][1] < 1e-4, result
        assert result["bfloat16"][0] < 1e-2 and result["bfloat16"][1] < 0.06, result


def fsdp2_setting():
    """The model, the 12 episodes, their advantages and the config of the FSDP2 comparison below."""
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir(), dtype=torch.float32)
    full = B.collate(episodes(base.config.vocab_size), 0)
    adv, _ = A.advantages("grpo", A.Step(full["rewards"], full["groups"], full["mask"]))
    return base, full, adv, configs.Config(kl_coef=0.0, micro_tokens=40, grad_clip=1e9, shared_prefix=False)


def _fsdp2_micro_batched(rank):
    """train.update under FSDP2, each rank its 6 of the 12 episodes in several micro-batches (on CPU the
    gradients are reduced once, after the last): the number of micro-batches and the full gradients."""
    from torch.distributed.device_mesh import init_device_mesh

    from infra import distributed

    mesh = init_device_mesh("cpu", (2,))
    base, _, adv, cfg = fsdp2_setting()
    model = distributed.shard(copy.deepcopy(base), mesh, "float32", False)
    mine = B.collate(episodes(base.config.vocab_size)[rank * 6:(rank + 1) * 6], 0)
    rec = Recorder(model)
    mine_adv = adv[rank * 6:(rank + 1) * 6, :mine["mask"].shape[1]]
    train.update(cfg, {"policy": model}, {"policy": rec}, train.Scored(mine, mine_adv, mine_adv))
    lengths = mine["attn"].sum(1)
    micro = len(P.micro_batches(list(range(6)), lengths, cfg.micro_tokens))
    return micro, [g.full_tensor().numpy() for g in rec.grads[0]]  # arrays: sent back by plain pickling


def test_fsdp2_update_over_micro_batches_has_the_one_process_gradient(one_rank):
    """Those gradients equal one process's (this one, rank 0 of 1) updating on all 12 episodes."""
    from tests.test_distributed import spawn

    sharded = spawn(_fsdp2_micro_batched, "gloo")
    base, full, adv, cfg = fsdp2_setting()
    one = Recorder(base)
    train.update(cfg, {"policy": base}, {"policy": one}, train.Scored(full, adv, adv))
    for micro, grads in sharded:
        err = max(float((torch.from_numpy(a) - b).abs().max() / b.abs().max()) for a, b in zip(grads, one.grads[0]))
        assert micro >= 2 and err < 1e-5, (micro, err)
