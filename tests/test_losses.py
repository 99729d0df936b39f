"""losses.py's losses (policy, value, KL) and KL estimators against hand-computed values (each worked
out in a comment) and properties: masked-out entries never reach a loss or its gradient, and micro-batches
with a global normaliser add up to the whole batch. The advantage estimators and masked reductions are in
tests/test_algorithms.py.

Float64 throughout so that hand values can be compared tightly.
"""
import math

import pytest
import torch

import losses as L

from tests.support.float64 import NAN, close, float64_default, t  # noqa: F401 (an autouse fixture)


# ------------------------------------------------------------------ losses by hand

# Tokens (clip .2/.2): a: A=+1 rho=1.5 -> max(-1.5, -1.2) = -1.2  (high clip active)
#                      b: A=-1 rho=0.5 -> max(0.5, 0.8)   = 0.8   (low clip active)
#                      c: A=+2 rho=0.5 -> max(-1.0, -1.6) = -1.0  (unclipped: pessimistic bound)
#                      d: A=-1 rho=4   -> max(4, 1.2)     = 4     (dual clip c=3: min(4, 3) = 3)
#                      f: A=0  rho=1   -> 0;   e: masked out, NaN everywhere
# rows: [a, b, e], [c, d, f];  mask [[1,1,0],[1,1,1]]
RHO = t([[1.5, 0.5, 1.0], [0.5, 4.0, 1.0]])
ADV = t([[1.0, -1.0, NAN], [2.0, -1.0, 0.0]])
MASK_PL = t([[1, 1, 0], [1, 1, 1]])
OLD = t([[-1.0, -2.0, NAN], [-0.5, -3.0, -1.0]])


def new_logp():
    logp = OLD + torch.log(RHO)
    logp[0, 2] = NAN
    return logp.clone().requires_grad_()


def test_policy_loss_by_hand():
    logp = new_logp()
    loss, met = L.policy_loss(logp, OLD, ADV, MASK_PL)
    close(loss, (-1.2 + 0.8 - 1.0 + 4.0 + 0.0) / 5)   # token-mean = 2.6 / 5
    loss.backward()
    # d/dlogp of -A*rho = -A*rho where unclipped, 0 where clipped: c: -2*.5 = -1, d: 4, f: 0; / 5
    close(logp.grad, t([[0.0, 0.0, 0.0], [-0.2, 0.8, 0.0]]))
    close(met["clip_frac"], 2 / 5)
    close(met["clip_frac_low"], 1 / 5)
    close(met["clip_frac_high"], 1 / 5)
    close(met["dual_clip_frac"], 0.0)
    close(met["ratio_min"], 0.5)
    close(met["ratio_max"], 4.0)
    close(met["ratio_mean"], (1.5 + 0.5 + 0.5 + 4.0 + 1.0) / 5)
    rho = t([1.5, 0.5, 0.5, 4.0, 1.0])
    close(met["approx_kl"], (rho - 1 - rho.log()).mean())  # k3 estimate of KL(old || new)


def test_policy_loss_asymmetric_and_dual_clip_and_aggregations():
    # clip_high .28: a -> max(-1.5, -1.28) = -1.28; total (-1.28 + .8 - 1 + 4) / 5 = .504
    close(L.policy_loss(new_logp(), OLD, ADV, MASK_PL, L.Clip(high=0.28))[0], 2.52 / 5)
    # dual clip 3: d -> 3; total (-1.2 + .8 - 1 + 3) / 5 = .32, and d carries no gradient
    logp = new_logp()
    loss, met = L.policy_loss(logp, OLD, ADV, MASK_PL, L.Clip(dual=3.0))
    close(loss, 1.6 / 5)
    loss.backward()
    close(logp.grad, t([[0.0, 0.0, 0.0], [-0.2, 0.0, 0.0]]))
    close(met["dual_clip_frac"], 1 / 5)
    # seq-mean-token-mean: row means (-1.2 + .8)/2 = -.2 and (-1 + 4 + 0)/3 = 1; mean over 2 rows = .4
    close(L.policy_loss(new_logp(), OLD, ADV, MASK_PL, agg="seq-mean-token-mean")[0], 0.4)
    # seq-sum-norm with constant 10 (e.g. max length 5 * 2 sequences): 2.6 / 10
    close(L.policy_loss(new_logp(), OLD, ADV, MASK_PL, agg="seq-sum-norm", normalizer=10)[0], 0.26)
    # a global token count of 13 (other ranks hold more tokens): 2.6 / 13
    close(L.policy_loss(new_logp(), OLD, ADV, MASK_PL, normalizer=13)[0], 0.2)


def test_policy_loss_errors_and_empty_mask():
    with pytest.raises(ValueError, match="needs a constant normalizer"):
        L.policy_loss(new_logp(), OLD, ADV, MASK_PL, agg="seq-sum-norm")
    with pytest.raises(ValueError, match="unknown agg 'mean'"):
        L.policy_loss(new_logp(), OLD, ADV, MASK_PL, agg="mean")
    with pytest.raises(ValueError, match="dual_clip must be > 1"):
        L.policy_loss(new_logp(), OLD, ADV, MASK_PL, L.Clip(dual=0.5))
    with pytest.raises(ValueError, match="normalizer must be a finite number >= 0"):
        L.policy_loss(new_logp(), OLD, ADV, MASK_PL, normalizer=-1)
    logp = new_logp()
    loss, met = L.policy_loss(logp, OLD, ADV, torch.zeros(2, 3), normalizer=0)
    loss.backward()
    assert loss.item() == 0 and torch.equal(logp.grad, torch.zeros(2, 3))
    assert met["ratio_min"].item() == met["ratio_max"].item() == met["ratio_mean"].item() == 1.0
    assert all(math.isfinite(float(v)) for v in met.values())


def test_value_loss_by_hand():
    # token 1: v .5, old 0, R 1: (.5-1)^2 = .25; clipped v = .2: (.2-1)^2 = .64 -> .5 * .64 = .32
    # token 2: v .1, old 0, R -1: (.1+1)^2 = 1.21, inside the clip -> .605;  token 3 masked (NaN)
    # token-mean (.32 + .605) / 2 = .4625;  without clipping (.125 + .605) / 2 = .365
    v = t([[0.5, 0.1, NAN]]).requires_grad_()
    old, ret, mask = t([[0.0, 0.0, NAN]]), t([[1.0, -1.0, NAN]]), t([[1, 1, 0]])
    loss, met = L.value_loss(v, old, ret, mask, clip=0.2)
    close(loss, 0.4625)
    close(met["clip_frac"], 0.5)
    loss.backward()
    # token 1 clipped -> no gradient; token 2: d/dv .5 (v-R)^2 / 2 = (1.1) / 2
    close(v.grad, t([[0.0, 0.55, 0.0]]))
    close(L.value_loss(v, old, ret, mask, clip=None)[0], 0.365)
    close(L.value_loss(v, old, ret, mask, normalizer=5)[0], 0.925 / 5)


def test_kl_kinds_by_hand():
    logp, ref = t([-1.0, -2.0]), t([-2.0, -1.0])
    # d = logp - ref = [1, -1]; k1 = d; k2 = d^2/2 = 0.5; k3 = exp(-d) + d - 1 = [e^-1, e - 2]
    close(L.kl_penalty(logp, ref, "k1"), t([1.0, -1.0]))
    close(L.kl_penalty(logp, ref, "k2"), t([0.5, 0.5]))
    close(L.kl_penalty(logp, ref, "k3"), t([math.exp(-1), math.e - 2]))
    assert L.kl_penalty(t([-1.3]), t([-1.3]), "k3").item() == 0.0
    with pytest.raises(ValueError, match="unknown KL kind 'k4'"):
        L.kl_penalty(logp, ref, "k4")


def test_k3_is_clamped_and_its_gradient_finite():
    # d = -30: -d clamps to 20, exp(20) - 20 - 1 >> 10 -> 10; without the clamp exp(30) * 0 risks NaN
    logp = t([-30.0, -1000.0]).requires_grad_()
    k = L.kl_penalty(logp, t([0.0, 0.0]), "k3")
    close(k, t([10.0, 10.0]))
    k.sum().backward()
    assert torch.isfinite(logp.grad).all()


def test_kl_loss_by_hand():
    # k3 on d = [1, -1] -> [e^-1, e - 2], third token masked: mean = (e^-1 + e - 2) / 2
    logp, ref, mask = t([[-1.0, -2.0, NAN]]), t([[-2.0, -1.0, 5.0]]), t([[1, 1, 0]])
    close(L.kl_loss(logp, ref, mask), (math.exp(-1) + math.e - 2) / 2)
    close(L.kl_loss(logp, ref, mask, kind="k1"), 0.0)
    close(L.kl_loss(logp, ref, mask, kind="k2", normalizer=4), 1.0 / 4)


# ------------------------------------------------------------------ loss properties

@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_micro_batches_with_global_normalizer_match_the_whole_batch(agg):
    gen = torch.Generator().manual_seed(6)
    B, T = 8, 7
    mask = (torch.rand(B, T, generator=gen) < 0.5).double()
    old = -torch.rand(B, T, generator=gen) * 3
    adv = torch.randn(B, T, generator=gen)
    base = old + torch.randn(B, T, generator=gen) * 0.3
    norm = mask.sum().item() if agg == "token-mean" else B

    logp = base.clone().requires_grad_()
    whole, _ = L.policy_loss(logp, old, adv, mask, L.Clip(dual=3.0), agg=agg)
    whole.backward()
    logp_mb = base.clone().requires_grad_()
    total = 0
    for rows in (slice(0, 3), slice(3, 4), slice(4, 8)):  # uneven micro-batches, as gradient accumulation
        part, _ = L.policy_loss(logp_mb[rows], old[rows], adv[rows], mask[rows], L.Clip(dual=3.0), agg=agg,
                                normalizer=norm)
        part.backward()
        total = total + part.detach()
    close(total, whole.detach())
    close(logp_mb.grad, logp.grad)
    # while the local-count default does depend on the split (the pitfall the normaliser guards against)
    local = sum(L.policy_loss(base[r], old[r], adv[r], mask[r], agg=agg)[0] for r in (slice(0, 3), slice(3, 8)))
    assert abs(local.item() - whole.item()) > 1e-6


def test_losses_ignore_masked_out_entries_including_gradients():
    gen = torch.Generator().manual_seed(7)
    B, T = 4, 6
    mask = (torch.rand(B, T, generator=gen) < 0.5).double()
    off = mask == 0
    tensors = [torch.randn(B, T, generator=gen) - 1 for _ in range(5)]

    def run(junk):
        ins = [torch.where(off, junk, x) for x in tensors]
        logp, v = ins[0].clone().requires_grad_(), ins[3].clone().requires_grad_()
        pl, _ = L.policy_loss(logp, ins[1], ins[2], mask, L.Clip(dual=2.0))
        vl, _ = L.value_loss(v, ins[4], ins[2], mask)
        kl = L.kl_loss(logp, ins[1], mask)
        (pl + vl + kl).backward()
        return pl.detach(), vl.detach(), kl.detach(), logp.grad, v.grad

    base = run(torch.zeros(B, T))
    for junk in (torch.full((B, T), NAN), torch.full((B, T), -math.inf), torch.randn(B, T) * 1e4):
        for a, b in zip(base, run(junk)):
            assert torch.equal(a, b)
