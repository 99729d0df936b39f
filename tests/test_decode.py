"""infra/decode.py, the project's own decode loop, with its decode_sampling.py and decode_cpu.py, on the CPU:
its sampler and seeds, the same tokens as transformers under greedy decoding (float32, tiny model and
SmolLM2), the model's own logprobs in bfloat16, KV rows reused across turns exactly as a fresh prefill, a
group's prompt prefilled once, and a weight sync that drops every cached row; an exception in decode that
leaves the next call whole, rows copied from shared units a layer at a time, the attention mask made once
for every layer, SDPA's kernels chosen. CUDA graphs and streams run only on a GPU (bench/gpu_check.py,
bench/generate.py --device cuda); here the engine's retry of a failed capture runs against a stand-in
capture, and decode_cuda.py's handling against a stand-in for torch.cuda (tests/test_decode_cuda.py)."""
import types
import weakref

import pytest
import torch
from transformers import AutoModelForCausalLM

from infra import decode, decode_cpu, decode_kernel
from infra import decode_sampling as sampling
import engine as engines
from infra import engines as infra_engines
from models import tiny
from tests.test_engine import STOPS, check_samples, prompts_of


@pytest.fixture(scope="module")
def model_dir():
    return tiny.tiny_model_dir()


def test_uniform_is_splitmix64_with_wrapping_int64():
    seeds = [0, 1, 7, 2**62 + 12345, 2**63 - 1, 987654321987654321]
    positions = [0, 1, 5, 1000, 4095, 70000]
    got = sampling.uniform(torch.tensor(seeds), torch.tensor(positions))
    assert got.tolist() == [sampling.splitmix64(s, p) for s, p in zip(seeds, positions)]
    many = sampling.uniform(torch.arange(20000), torch.full((20000,), 3))
    assert 0 <= many.min() and many.max() < 1 and abs(many.mean().item() - 0.5) < 0.01


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_sampler_draws_softmax_over_temperature_and_top_p(dtype):
    logits = torch.tensor([2.0, 1.0, 0.5, -1.0, -30.0]).to(dtype).float()
    n = 40000
    u = sampling.uniform(torch.arange(n) * 7919, torch.zeros(n, dtype=torch.long))
    for temperature, top_p in ((1.0, 1.0), (0.7, 1.0), (1.0, 0.8)):
        tokens, logprobs = sampling.sample(logits.expand(n, -1), u, temperature, top_p)
        want = torch.softmax(logits.double() / temperature, -1)
        if top_p < 1:  # the nucleus: tokens 0 and 1 (0.61, then 0.84 >= 0.8), renormalised
            want = torch.where(torch.arange(5) < 2, want, 0.0)
            want /= want.sum()
        freq = torch.bincount(tokens, minlength=5).double() / n
        assert (freq - want).abs().max() < 0.01, (temperature, top_p, freq, want)
        assert torch.allclose(logprobs.double(), torch.log_softmax(logits.double(), -1)[tokens], atol=1e-6)
    greedy, _ = sampling.sample(logits.expand(3, -1), u[:3], 0.0, 1.0)
    assert greedy.tolist() == [0, 0, 0]


def test_greedy_gives_transformers_tokens_in_float32(model_dir):
    hf, own = engines.HFEngine(model_dir, "cpu", "float32"), decode.TorchEngine(model_dir, "cpu", "float32")
    prompts = prompts_of([7, 20, 33, 20, 9, 14, 50, 3])
    caps = [2, 6, 30, 30, 30, 12, 20, 9]
    params = engines.Sampling(max_tokens=caps, temperature=0.0, stop_ids=STOPS)
    a, b = hf.generate(prompts, params), own.generate(prompts, params)
    assert [s.ids for s in a] == [s.ids for s in b]
    for s, t in zip(a, b):
        assert torch.allclose(torch.tensor(s.logprobs), torch.tensor(t.logprobs), atol=1e-5)
    stopped, capped = check_samples(b, caps, set(STOPS))
    assert stopped and capped


def test_sampled_logprobs_are_the_models_own_in_bfloat16(model_dir):
    eng = engines.make_engine(model_dir, "torch", dtype="bfloat16")
    assert isinstance(eng, decode.TorchEngine) and eng.model.dtype == torch.bfloat16
    prompts = prompts_of([7, 20, 33, 20, 9, 14] * 2)
    caps = [2, 6, 30, 30, 30, 12] * 2
    out = eng.generate(prompts, engines.Sampling(max_tokens=caps, seed=1, stop_ids=STOPS))
    stopped, capped = check_samples(out, caps, set(STOPS))
    assert stopped and capped
    for p, s in zip(prompts, out):  # what the trainer recomputes: one forward over prompt + reply
        with torch.no_grad():
            ref = torch.log_softmax(eng.model(torch.tensor([p + s.ids])).logits[0, len(p) - 1:-1].float(), -1)
        assert torch.allclose(ref[torch.arange(len(s.ids)), s.ids], torch.tensor(s.logprobs), atol=0.05)


def two_turns(eng, params, seed=0):
    """A first turn, then a second whose prompts extend the first's with its replies and an observation."""
    first = prompts_of([40, 75, 33, 64], seed)
    out = eng.generate(first, params)
    obs = prompts_of([5, 9, 1, 30], seed + 1)
    return [p + s.ids + o for p, s, o in zip(first, out, obs)]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_kv_kept_across_turns_gives_what_a_fresh_prefill_gives(model_dir, dtype):
    params = engines.Sampling(max_tokens=12, seed=3)
    eng = decode.TorchEngine(model_dir, "cpu", dtype)
    second = two_turns(eng, params)
    before = dict(eng.stats)
    reused = eng.generate(second, params)
    prefilled = eng.stats["prefill_tokens"] - before["prefill_tokens"]
    fresh_eng = decode.TorchEngine(model_dir, "cpu", dtype)
    fresh = fresh_eng.generate(second, params)
    assert [s.ids for s in reused] == [s.ids for s in fresh]
    for s, t in zip(reused, fresh):
        assert torch.allclose(torch.tensor(s.logprobs), torch.tensor(t.logprobs), atol=1e-5 if dtype == "float32" else 0.02)
    # only each row's new tokens ran: the first turn's last reply token and the observation, less the
    # prompt's last token (the first decode step's input)
    assert prefilled == sum(1 + n for n in (5, 9, 1, 30)) - len(second)
    assert fresh_eng.stats["prefill_tokens"] == sum(len(p) - 1 for p in second)


def test_a_groups_prompt_is_prefilled_once_and_each_sample_seeded_on_its_own(model_dir):
    eng = decode.TorchEngine(model_dir, "cpu", "float32")
    a, b = prompts_of([45, 70], 5)
    prompts = [a] * 4 + [b] * 4
    out = eng.generate(prompts, engines.Sampling(max_tokens=10, seed=11))
    assert eng.stats["prefill_tokens"] == len(a) - 1 + len(b) - 1
    assert len({tuple(s.ids) for s in out[:4]}) > 1  # seeds 11..14: four different samples of one prompt
    # a request's sample depends on its prompt and seed only, not on its batch or its place in it
    alone = decode.TorchEngine(model_dir, "cpu", "float32").generate([b, a], engines.Sampling(max_tokens=10, seed=[16, 12]))
    assert alone[0].ids == out[5].ids and alone[1].ids == out[1].ids
    assert torch.allclose(torch.tensor(alone[0].logprobs), torch.tensor(out[5].logprobs), atol=1e-5)


def test_a_weight_sync_drops_every_cached_row(model_dir):
    eng = decode.TorchEngine(model_dir, "cpu", "float32")
    params = engines.Sampling(max_tokens=8, temperature=0.0)
    second = two_turns(eng, params)
    assert eng.cache is not None and eng.index
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    with torch.no_grad():
        model.model.norm.weight *= 10
        for layer in model.model.layers:
            layer.self_attn.k_proj.weight.mul_(-2)
    eng.sync_weights(model.state_dict().items())
    assert eng.cache is None and not eng.index
    before = eng.stats["prefill_tokens"]
    out = eng.generate(second, params)
    assert eng.stats["prefill_tokens"] - before == sum(len(p) - 1 for p in second)  # nothing reused
    for p, s in zip(second, out):  # greedy under the new weights
        with torch.no_grad():
            ref = torch.log_softmax(model(torch.tensor([p + s.ids])).logits[0, len(p) - 1:-1], -1)
        assert s.ids == ref.argmax(-1).tolist()
        assert torch.allclose(ref[torch.arange(len(s.ids)), s.ids], torch.tensor(s.logprobs), atol=1e-5)


def test_auto_takes_the_own_loop_on_cuda_without_vllm_and_on_cpus_without_bf16(monkeypatch):
    monkeypatch.setattr(infra_engines, "vllm_available", lambda: False)
    monkeypatch.setattr(infra_engines, "cpu_supports_bf16", lambda: True)
    assert engines.engine_kind("auto", "cuda") == "torch" and engines.engine_kind("auto", "cuda:1") == "torch"
    assert engines.engine_kind("auto", "cpu") == "hf" and engines.engine_kind("hf", "cuda") == "hf"
    monkeypatch.setattr(infra_engines, "vllm_available", lambda: True)
    assert engines.engine_kind("auto", "cuda") == "vllm" and engines.engine_kind("auto", "cpu") == "vllm"
    # an AVX2-only CPU runs float32, where the decode loop was measured faster than vLLM's CPU build
    monkeypatch.setattr(infra_engines, "cpu_supports_bf16", lambda: False)
    assert engines.engine_kind("auto", "cpu") == "torch" and engines.engine_kind("auto", "cuda") == "vllm"
    assert engines.engine_kind("vllm", "cpu") == "vllm"  # asked for by name: taken as asked


def test_an_unsupported_model_is_refused_with_the_way_out():
    from transformers import GPT2Config, LlamaConfig, Qwen2Config
    assert decode.supports(LlamaConfig()) is None
    assert "--engine hf" in decode.supports(GPT2Config())
    assert "sliding" in decode.supports(Qwen2Config(use_sliding_window=True))


def test_smollm2_greedy_in_float32_and_sampled_in_bfloat16():
    """The real model: the same greedy tokens as transformers in float32; bf16 logprobs close to its own."""
    from models.smollm2 import smollm2_dir
    from transformers import AutoTokenizer

    path = str(smollm2_dir())
    tok = AutoTokenizer.from_pretrained(path)
    prompts = [tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                       tokenize=True, return_dict=True)["input_ids"]
               for text in ("You are in a room with a red ball. Go to the red ball. What do you do?",
                            "Name three colours.", "Write the word yes.")]
    params = engines.Sampling(max_tokens=16, temperature=0.0, stop_ids=engines.stop_ids(path))
    a = engines.HFEngine(path, "cpu", "float32").generate(prompts, params)
    b = decode.TorchEngine(path, "cpu", "float32").generate(prompts, params)
    assert [s.ids for s in a] == [s.ids for s in b]
    eng = decode.TorchEngine(path, "cpu", "bfloat16")  # two prompts: bf16 is emulated, slowly, on AVX2-only CPUs
    out = eng.generate(prompts[:2], engines.Sampling(max_tokens=12, seed=0, stop_ids=engines.stop_ids(path)))
    gaps = []
    for p, s in zip(prompts, out):
        with torch.no_grad():
            ref = torch.log_softmax(eng.model(torch.tensor([p + s.ids])).logits[0, len(p) - 1:-1].float(), -1)
        gaps += (ref[torch.arange(len(s.ids)), s.ids] - torch.tensor(s.logprobs)).abs().tolist()
    assert sum(gaps) / len(gaps) < 0.05 and max(gaps) < 0.3, gaps


def test_train_py_runs_its_steps_and_evaluations_on_the_own_loop(tmp_path):
    """train.py with --engine torch: rollouts, sleep, weight sync and in-training evaluations through the
    decode loop, two steps on the tiny model (the wiring, not learning)."""
    import subprocess
    import sys
    from tests.test_train import ROOT, metrics

    out = tmp_path / "run"
    cmd = [sys.executable, "train.py", "--env", "textcraft", "--engine", "torch", "--steps", "2", "--tasks-per-step", "2",
           "--samples-per-task", "2", "--max-tokens", "8", "--horizon", "2", "--eval-every", "1", "--eval-tasks", "2",
           "--out", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = metrics(out)
    assert len(rows) == 2 and all("eval/success" in r for r in rows)
    assert all(r["sampler_gap"] < 1e-3 for r in rows)  # float32: the trainer scores the samples as sampled


def test_an_exception_in_decode_leaves_the_cache_and_its_index_consistent(model_dir, monkeypatch):
    """The old cache's index outlived its cache: after a failed call the next one raised IndexError in `match`."""
    params = engines.Sampling(max_tokens=8, seed=2)
    eng = decode.TorchEngine(model_dir, "cpu", "float32")
    second = two_turns(eng, params)
    second = second + second[:2]  # two prompts twice: their rows are copied from shared units (gather_rows)
    real, calls = decode.sample, []

    def failing(*args):  # the third decode step of the second call fails
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("injected")
        return real(*args)
    monkeypatch.setattr(decode, "sample", failing)  # the name the decode loop calls
    with pytest.raises(RuntimeError, match="injected"):
        eng.generate(second, params)
    monkeypatch.setattr(decode, "sample", real)
    again = eng.generate(second, params)
    fresh = decode.TorchEngine(model_dir, "cpu", "float32").generate(second, params)
    assert [s.ids for s in again] == [s.ids for s in fresh]
    assert eng.index and len(eng.cache.ids) == len(second)


def test_rows_copied_from_shared_units_free_each_layer_as_its_rows_arrive():
    layers = 5
    units = [torch.randn(2, 3, 64, 8) for _ in range(2 * layers)]
    want = [t[torch.tensor([0, 1, 1, 0])] for t in units]
    refs = [weakref.ref(t) for t in units]
    alive = []

    class Layers(list):  # how many units are alive each time a layer's rows are stored
        def __setitem__(self, i, value):
            alive.append(sum(r() is not None for r in refs))
            super().__setitem__(i, value)
    cache = decode.Cache(Layers(units[:layers]), Layers(units[layers:]), [])
    del units
    decode.gather_rows(cache, torch.tensor([0, 1, 1, 0]))
    assert all(torch.equal(a, b) for a, b in zip(cache.keys + cache.values, want))
    # one unit fewer at each store: when the last layer's rows arrive, only that layer's units are left
    assert alive == list(range(2 * layers, 0, -1)) and all(r() is None for r in refs)


def test_attend_with_one_bias_for_every_layer_is_per_head_attention():
    torch.manual_seed(0)
    b, s, heads, kv, dim, width = 3, 2, 6, 2, 8, 64
    q, k, v = torch.randn(b, s, heads, dim), torch.randn(b, kv, width, dim), torch.randn(b, kv, width, dim)
    pos = torch.tensor([[5, 6], [40, 41], [0, 1]])
    visible = torch.arange(width)[None, None] <= pos[:, :, None]                       # (b, s, W)
    bias = decode.attention_bias(visible, heads // kv, torch.float32)
    assert bias.shape == (b, 1, heads // kv * s, width) and torch.isinf(bias).any()
    out = decode.attend(q, k, v, bias, 0.3)
    # the plain computation: every query head against its KV head, copied (repeat_kv), softmax over visible keys
    kk, vv = k.repeat_interleave(heads // kv, 1), v.repeat_interleave(heads // kv, 1)   # (b, H, W, D)
    scores = torch.einsum("bshd,bhwd->bhsw", q, kk) * 0.3
    scores = scores.masked_fill(~visible[:, None], float("-inf"))
    ref = torch.einsum("bhsw,bhwd->bshd", scores.softmax(-1), vv).reshape(b, s, heads * dim)
    assert torch.allclose(out, ref, atol=1e-5)


def test_sdpa_runs_a_kernel_of_the_engines_stated_list(model_dir):
    eng = decode.TorchEngine(model_dir, "cpu", "float32")
    assert eng.backends == decode.BACKENDS["cpu"] and decode.BACKENDS["cuda"] == [decode.SDPBackend.EFFICIENT_ATTENTION]
    q, k = torch.randn(4, 2, 6, 16), torch.randn(4, 2, 64, 16)
    bias = decode.attention_bias(torch.arange(64)[None, None] <= torch.full((4, 3, 1), 9), 2, torch.float32)
    with eng.scope():  # what torch picks for a decode step's shapes under the engine's list
        chosen = decode.SDPBackend(torch._fused_sdp_choice(q, k, k, attn_mask=bias))
    assert chosen in eng.backends


def test_a_failed_capture_is_tried_again_on_the_next_call_a_bounded_number_of_times(model_dir, capsys):
    params = engines.Sampling(max_tokens=6, seed=4)
    prompts = prompts_of([20, 33, 9], 3)
    reference = decode.TorchEngine(model_dir, "cpu", "float32", graphs=True)  # the same steps as a graph's
    reference._capture = lambda step: types.SimpleNamespace(replay=step)    # every capture succeeds
    want = reference.generate(prompts, params)
    eng = decode.TorchEngine(model_dir, "cpu", "float32", graphs=True)
    tries, outcomes = [], ["fail", "ok"] + ["fail"] * decode.CAPTURE_TRIES

    def stand_in(step):  # a capture that fails, or one whose replay runs the step (what a graph's replay computes)
        tries.append(outcomes[len(tries)])
        if tries[-1] == "fail":
            raise RuntimeError("capture invalidated")
        return types.SimpleNamespace(replay=step)
    eng._capture = stand_in
    for call in range(2 + decode.CAPTURE_TRIES + 1):
        out = eng.generate(prompts, params)
        assert [s.ids for s in out] == [s.ids for s in want] and [s.logprobs for s in out] == [s.logprobs for s in want]
        eng.reset()
    # tried on every call until CAPTURE_TRIES failures in a row (a success in between resets the count)
    assert tries == outcomes and eng.stats["graph_captures"] == 1
    assert eng.stats["capture_failures"] == 1 + decode.CAPTURE_TRIES
    assert "tried again on the next call" in capsys.readouterr().out


def test_attend_over_the_kept_positions_is_per_head_attention():
    torch.manual_seed(1)
    b, heads, kv, dim, width, kept = 3, 6, 2, 8, 64, 45
    q, k, v = torch.randn(b, 1, heads, dim), torch.randn(b, kv, width, dim), torch.randn(b, kv, width, dim)
    pos = torch.tensor([[5], [44], [0]])
    # positions from `kept` on hold garbage (unwritten rows): they must not count, so they are huge here
    k[:, :, kept:], v[:, :, kept:] = 1e4, 1e4
    bias = decode.attention_bias(torch.arange(kept)[None, None] <= pos[:, :, None], heads // kv, torch.float32)
    out = decode_cpu.attend_kept(q, k, v, bias, 0.3, kept)
    kk, vv = k.repeat_interleave(heads // kv, 1), v.repeat_interleave(heads // kv, 1)   # (b, H, W, D)
    scores = torch.einsum("bshd,bhwd->bhsw", q, kk) * 0.3
    scores = scores.masked_fill(~(torch.arange(width)[None, None] <= pos[:, :, None])[:, None], float("-inf"))
    ref = torch.einsum("bhsw,bhwd->bshd", scores.softmax(-1), vv).reshape(b, 1, heads * dim)
    assert torch.allclose(out, ref, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_attention_loop_is_per_head_attention_over_each_rows_positions(dtype):
    """infra/decode_kernel.py's C++ loop against a float64 reference: row r sees positions 0..last[r] of a
    strided view of a wider cache (SmolLM2's grouping: 9 query heads over 3 KV heads), whatever lies beyond."""
    if why := decode_kernel.problem(torch.device("cpu"), dtype):
        pytest.fail(why)  # the suite's set-up provides the compiler and ninja
    torch.manual_seed(2)
    b, heads, kv, dim, width = 4, 9, 3, 64, 96
    q = torch.randn(b, 1, heads, dim).to(dtype)
    cache_k, cache_v = torch.randn(2 * b, kv, width, dim).to(dtype), torch.randn(2 * b, kv, width, dim).to(dtype)
    k, v = cache_k[1::2], cache_v[1::2]  # views with the cache's strides, as the engine passes them
    last = torch.tensor([0, 5, 63, 95])
    for r, n in enumerate(last.tolist()):  # beyond a row's last position: garbage that must not count
        k[r, :, n + 1:], v[r, :, n + 1:] = 1e4, float("nan")
    out = decode_kernel.attend_loop(q, k, v, last, 0.125)
    kk = k.double().repeat_interleave(heads // kv, 1)[:, :, None]                        # (b, H, 1, W, D)
    vv = v.double().repeat_interleave(heads // kv, 1)
    scores = (q.double().transpose(1, 2)[..., None, :] * kk).sum(-1) * 0.125           # (b, H, 1, W)
    scores = scores.masked_fill(~(torch.arange(width) <= last[:, None])[:, None, None], float("-inf"))
    weights = torch.nan_to_num(scores.softmax(-1))
    ref = torch.einsum("bhsw,bhwd->bshd", weights, torch.nan_to_num(vv)).reshape(b, 1, heads * dim)
    assert out.dtype == dtype and out.shape == ref.shape
    tol = 1e-5 if dtype == torch.float32 else 1e-2  # bf16: the output's own rounding
    assert torch.allclose(out.double(), ref, atol=tol, rtol=tol), (out.double() - ref).abs().max()


def test_the_attention_loop_leaves_the_process_float_semantics_alone():
    """The loop is compiled with -ffast-math; linked into a shared library that flag sets flush-to-zero for the
    whole process (gcc's crtfastmath.o), which would change every float op of the trainer. It is a compile flag
    only: a subnormal float survives the kernel's load."""
    assert decode_kernel.problem(torch.device("cpu"), torch.float32) is None
    tiny_value = torch.tensor(1e-40, dtype=torch.float32)
    assert (tiny_value * 1.0).item() != 0.0 and (tiny_value / 2).item() != 0.0


def test_the_cpu_levers_are_on_by_default_in_float32_and_give_the_plain_paths_tokens(model_dir):
    """Packed weights (q/k/v and gate/up fused, biases included: the tiny model is a Qwen2), attention over the
    kept positions, and the same as a C++ loop compute what the module weights and SDPA compute."""
    prompts = prompts_of([7, 20, 33, 20, 9, 14, 50, 3], 2)
    outs = {}
    for packed in (False, True):
        for kept in (False, True):
            eng = decode.TorchEngine(model_dir, "cpu", "float32", packed=packed, kept_attention=kept, kernel=False)
            outs[packed, kept] = eng.generate(prompts, engines.Sampling(max_tokens=20, seed=5, stop_ids=STOPS))
            assert isinstance(eng.linears, decode_cpu.PackedLinears) == packed
    default = decode.TorchEngine(model_dir, "cpu", "float32")
    assert default.packed == decode_cpu.can_pack(torch.device("cpu"), torch.float32) and default.kept_attention
    assert default.kernel  # the attention loop builds here (the suite's set-up has the compiler)
    outs["loop"] = default.generate(prompts, engines.Sampling(max_tokens=20, seed=5, stop_ids=STOPS))
    plain = outs[False, False]
    for out in outs.values():
        assert [s.ids for s in out] == [s.ids for s in plain]
        for s, t in zip(out, plain):
            assert torch.allclose(torch.tensor(s.logprobs), torch.tensor(t.logprobs), atol=1e-5)


def test_packed_weights_are_packed_again_after_a_sync_and_dropped_by_sleep(model_dir, tmp_path):
    """Generation after a weight sync equals a fresh engine's on the new weights: the packed copies of the
    old ones are not used again."""
    eng = decode.TorchEngine(model_dir, "cpu", "float32", packed=True)
    params = engines.Sampling(max_tokens=10, seed=8, stop_ids=STOPS)
    second = two_turns(eng, params)
    before = eng.linears
    assert isinstance(before, decode_cpu.PackedLinears)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    with torch.no_grad():
        for layer in model.model.layers:  # every packed group changes: q/k/v, o, gate/up, down; and the head
            for lin in (layer.self_attn.q_proj, layer.self_attn.v_proj, layer.self_attn.o_proj,
                        layer.mlp.up_proj, layer.mlp.down_proj):
                lin.weight.mul_(-1.5)
        model.lm_head.weight.mul_(3)
    eng.sleep()
    assert eng.linears is None  # its memory given back while the trainer updates
    eng.sync_weights(model.state_dict().items())
    out = eng.generate(second, params)
    assert eng.linears is not before
    model.save_pretrained(tmp_path)  # the engine reads only the model
    fresh = decode.TorchEngine(str(tmp_path), "cpu", "float32", packed=True).generate(second, params)
    assert [s.ids for s in out] == [s.ids for s in fresh]
    for s, t in zip(out, fresh):
        assert torch.allclose(torch.tensor(s.logprobs), torch.tensor(t.logprobs), atol=1e-5)
    stale = decode.TorchEngine(model_dir, "cpu", "float32", packed=True).generate(second, params)
    assert [s.ids for s in out] != [s.ids for s in stale]  # the change shows: the test can fail
