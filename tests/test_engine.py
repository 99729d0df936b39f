"""Engine tests on CPU with the tiny model: the HF engine samples the distribution the trainer scores
whatever the model's generation_config.json says, stop ids, bf16 in both engines, and the order of
vLLM's sleep/wake/reload calls on GPU (against a recording stand-in, as there is no GPU here)."""
import json
import math
import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import engine as engines
from models import tiny


@pytest.fixture(scope="module")
def model_dir():
    return tiny.tiny_model_dir()


def prompts_of(lengths, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 1400, (n,), generator=gen).tolist() for n in lengths]


def write_generation_config(directory, **fields):
    (directory / "generation_config.json").write_text(json.dumps(fields))


def sharp_copies(model_dir, tmp_path, scale):
    """Two copies of the tiny model with its final norm scaled (x40: logits with a std of about 6), one
    with a generation_config.json asking for repetition_penalty=1.3 and top_k=3 as real chat models'
    configs do, plus min_p, which the engine never names; one with neutral settings."""
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    with torch.no_grad():
        model.model.norm.weight *= scale
    dirs = []
    for name, extra in (("penalised", dict(do_sample=True, repetition_penalty=1.3, top_k=3, min_p=0.2,
                                            temperature=0.7)),
                        ("neutral", {})):
        d = tmp_path / name
        shutil.copytree(model_dir, d)
        model.save_pretrained(d)
        write_generation_config(d, eos_token_id=1442, pad_token_id=1440, **extra)
        dirs.append(d)
    return dirs


# x40 is so sharp that most replies repeat one token, where the repetition penalty bites; x10 (logit std
# about 1.6) leaves several likely tokens per position, where top_k and min_p bite.
@pytest.mark.parametrize("scale", [40, 10])
def test_hf_sampling_ignores_the_models_generation_config(model_dir, tmp_path, scale):
    penalised, neutral = sharp_copies(model_dir, tmp_path, scale)
    a, b = engines.HFEngine(str(penalised), "cpu", "float32"), engines.HFEngine(str(neutral), "cpu", "float32")
    prompts = prompts_of([5, 12, 30, 12])
    for params in (engines.Sampling(max_tokens=24, seed=3), engines.Sampling(max_tokens=24, temperature=0.8,
                                                                             top_p=0.9, seed=4)):
        out_a, out_b = a.generate(prompts, params), b.generate(prompts, params)
        assert [s.ids for s in out_a] == [s.ids for s in out_b]
        assert [s.logprobs for s in out_a] == [s.logprobs for s in out_b]
    logits_std = a.model(torch.tensor([prompts[2]])).logits.std().item()
    assert 0.1 * scale < logits_std < 0.3 * scale


def test_hf_samples_the_whole_vocabulary_with_raw_logprobs(model_dir):
    """The untouched tiny model is nearly uniform over 2,048 tokens: without top-k most samples rank
    beyond 50 (transformers' global default top_k=50 would cut them), and the logprobs are those of a
    plain forward pass."""
    eng = engines.HFEngine(model_dir, "cpu", "float32")
    prompts = prompts_of([16] * 4)
    out = eng.generate(prompts, engines.Sampling(max_tokens=16, seed=0))
    seq = torch.tensor([p + s.ids for p, s in zip(prompts, out)])
    with torch.no_grad():
        logp = torch.log_softmax(eng.model(seq).logits[:, 15:-1].float(), -1)  # (B, 16, V)
    picked = logp.gather(-1, seq[:, 16:, None])
    ranks = (logp > picked).sum(-1)
    assert (ranks >= 50).float().mean() > 0.5
    assert torch.allclose(picked.squeeze(-1), torch.tensor([s.logprobs for s in out]), atol=1e-4)


def test_stop_ids_collects_every_declared_eos(model_dir, tmp_path):
    tok = AutoTokenizer.from_pretrained(model_dir)
    eos, endoftext = tok.eos_token_id, tok.convert_tokens_to_ids("<|endoftext|>")
    assert engines.stop_ids(model_dir) == (eos,)  # generation_config.json holds the same single int
    d = tmp_path / "listed"
    shutil.copytree(model_dir, d)
    write_generation_config(d, eos_token_id=[endoftext, eos])  # a list, like Qwen2.5-Instruct's
    assert engines.stop_ids(str(d)) == (eos, endoftext)
    assert engines.stop_ids(tok, str(d)) == (eos, endoftext)
    assert engines.stop_ids(tok) == (eos,)
    (d / "generation_config.json").unlink()
    assert engines.stop_ids(str(d)) == (eos,)


def check_samples(out, caps, stops):
    """Caps and stops respected; finite logprobs. Returns how many samples stopped and how many were capped."""
    stopped = capped = 0
    for s, cap in zip(out, caps):
        assert 1 <= len(s.ids) <= cap and len(s.logprobs) == len(s.ids)
        assert all(math.isfinite(x) and x <= 0 for x in s.logprobs)
        assert not set(s.ids[:-1]) & stops  # nothing after a stop token
        stopped += s.ids[-1] in stops
        capped += len(s.ids) == cap and s.ids[-1] not in stops
        assert s.ids[-1] in stops or len(s.ids) == cap
    return stopped, capped


STOPS = tuple(range(3, 1440, 12))  # ordinary tokens (vLLM refuses ids past the tokenizer): replies stop and hit caps


def test_hf_engine_in_bfloat16(model_dir):
    eng = engines.make_engine(model_dir, "hf", dtype="bfloat16")
    assert eng.model.dtype == torch.bfloat16
    prompts = prompts_of([7, 20, 33, 20, 9, 14] * 2)
    caps = [2, 6, 30, 30, 30, 12] * 2
    out = eng.generate(prompts, engines.Sampling(max_tokens=caps, seed=1, stop_ids=STOPS))
    stopped, capped = check_samples(out, caps, set(STOPS))
    assert stopped and capped
    for p, s in zip(prompts, out):  # logprobs of the bf16 model itself (left padding changes little)
        with torch.no_grad():
            ref = torch.log_softmax(eng.model(torch.tensor([p + s.ids])).logits[0, len(p) - 1:-1].float(), -1)
        assert torch.allclose(ref[torch.arange(len(s.ids)), s.ids], torch.tensor(s.logprobs), atol=0.05)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_vllm_engine_in_bfloat16(model_dir, monkeypatch, compiled):
    """Eager and torch.compile'd (inductor) alike: samples scored as the model scores them, and after the
    hand-made sleep a weight stream that changes every linear layer reaches the compiled graph too (a graph
    that kept the old packed weights would score the old model)."""
    if not engines.vllm_available():
        pytest.skip("vLLM is not installed")
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)  # whole GiB; unset, the cache is sized to the batch
    eng = engines.make_engine(model_dir, "vllm", dtype="bfloat16", max_model_len=512, max_seqs=12,
                              vllm=dict(compile="on" if compiled else "off"))
    assert eng.compiled == compiled
    from vllm.config import CompilationMode
    assert (eng.llm.llm_engine.vllm_config.compilation_config.mode != CompilationMode.NONE) == compiled
    try:
        need = engines.kv_cache_bytes(model_dir, "bfloat16", 512, 12)
        assert eng.llm.llm_engine.vllm_config.cache_config.kv_cache_memory_bytes == need < 2**30
        model = AutoModelForCausalLM.from_pretrained(model_dir)
        prompts = prompts_of([7, 20, 33, 20, 9, 14] * 2)
        caps = [2, 6, 30, 30, 30, 12] * 2
        out = eng.generate(prompts, engines.Sampling(max_tokens=caps, seed=1, stop_ids=STOPS))
        stopped, capped = check_samples(out, caps, set(STOPS))
        assert stopped and capped
        for p, s in zip(prompts, out):  # against the fp32 model: bf16 rounding only
            with torch.no_grad():
                ref = torch.log_softmax(model(torch.tensor([p + s.ids])).logits[0, len(p) - 1:-1], -1)
            assert torch.allclose(ref[torch.arange(len(s.ids)), s.ids], torch.tensor(s.logprobs), atol=0.05)
        eng.sleep()  # on CPU by hand: packed weights dropped, the KV cache's storage shrunk to nothing
        with pytest.raises(RuntimeError, match="sync_weights"):
            eng.generate([prompts[0]], engines.Sampling(max_tokens=2))
        with torch.no_grad():  # a bf16 weight stream that sharpens the logits (std about 0.16 -> 1.6)
            model.model.norm.weight *= 10
            for layer in model.model.layers:  # and moves every packed linear weight
                for linear in (layer.self_attn.q_proj, layer.self_attn.o_proj, layer.mlp.down_proj):
                    linear.weight.mul_(-2)
        eng.sync_weights((k, v.to(torch.bfloat16)) for k, v in model.state_dict().items())
        eng.llm.collective_rpc(dirty_the_heap)  # a busy allocator hands the KV cache back full of garbage
        eng.wake()  # the KV cache's storage back
        greedy = eng.generate([prompts[0]], engines.Sampling(max_tokens=8, temperature=0.0))[0]
        with torch.no_grad():
            ref = torch.log_softmax(model(torch.tensor([prompts[0] + greedy.ids])).logits[0, 6:-1], -1)
        assert torch.allclose(ref[torch.arange(8), greedy.ids], torch.tensor(greedy.logprobs), atol=0.05)
        assert (ref.max(-1).values - ref[torch.arange(8), greedy.ids]).max() < 0.05  # greedy up to bf16 ties
        assert sum(greedy.logprobs) / 8 > -5  # the old weights give every token about -7.4
    finally:
        eng.close()


def dirty_the_heap(worker):
    """Runs in the CPU worker: fill and free blocks the size of the released KV cache, so the allocator
    hands their NaN-filled memory to the next allocation of that size."""
    for _, size in worker.model_runner.released_kv:
        torch.full((size // 4,), float("nan"))


class RecordingLLM:
    """Stands in for vllm.LLM and records the calls the engine makes on GPU."""

    def __init__(self):
        self.calls = []

    def sleep(self, level=1):
        self.calls.append(("sleep", level))

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tags))

    def collective_rpc(self, method, kwargs=None):
        if method == "reload_weights":
            self.calls.append((method, [name for name, _ in kwargs["weights_iterator"]]))
        else:  # the CPU engine's own release and restore, run in the worker
            self.calls.append((method.__name__, kwargs))

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))


def recording_engine(device):
    eng = engines.VLLMEngine.__new__(engines.VLLMEngine)  # no real vLLM: only the sleep/wake bookkeeping
    eng.llm, eng.device, eng.released = RecordingLLM(), device, set()
    return eng


def test_vllm_sleep_discards_weights_and_sync_restores_them_before_the_kv_cache():
    eng = recording_engine("cuda")
    weights = [("w", torch.zeros(1))]
    eng.wake()  # first step: awake from the start
    eng.sleep()
    eng.sleep()
    with pytest.raises(RuntimeError, match="sync_weights"):  # level 2 discarded the weights
        eng.generate([[1]], engines.Sampling())
    eng.wake()  # train.py wakes before syncing: nothing can be woken before the weights are reloaded
    eng.sync_weights(iter(weights))
    with pytest.raises(RuntimeError, match="wake"):
        eng.generate([[1]], engines.Sampling())
    eng.wake()  # before the next rollout
    eng.wake()
    eng.sync_weights(iter(weights))  # awake: a plain reload
    assert eng.llm.calls == [("sleep", 2), ("wake_up", ["weights"]), ("reload_weights", ["w"]),
                             ("reset_prefix_cache",), ("wake_up", ["kv_cache"]),
                             ("reload_weights", ["w"]), ("reset_prefix_cache",)]
    assert not eng.released


def test_vllm_cpu_sleep_releases_by_hand_and_restores_packing_then_kv_cache():
    eng = recording_engine("cpu")
    eng.sleep()
    eng.sleep()
    with pytest.raises(RuntimeError, match="sync_weights"):
        eng.generate([[1]], engines.Sampling())
    eng.wake()  # nothing to wake before the weights are back
    eng.sync_weights(iter([("w", torch.zeros(1))]))
    with pytest.raises(RuntimeError, match="wake"):
        eng.generate([[1]], engines.Sampling())
    eng.wake()
    eng.wake()
    assert eng.llm.calls == [("release_cpu", None), ("reload_weights", ["w"]), ("restore_cpu", {"kv": False}),
                             ("reset_prefix_cache",), ("restore_cpu", {"kv": True})]
    assert not eng.released


def test_cpu_supports_bf16_reads_the_cpu_flags(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512bw avx512_bf16 amx_tile\n")
    assert engines.cpu_supports_bf16(str(info))
    info.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f amx_bf16\n")
    assert engines.cpu_supports_bf16(str(info))
    info.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512bw\n")
    assert not engines.cpu_supports_bf16(str(info))
    assert not engines.cpu_supports_bf16(str(tmp_path / "missing"))
    assert isinstance(engines.cpu_supports_bf16(), bool)
