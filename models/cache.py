"""The one cache the built models share: where they live, and how a finished build moves into place.

Both models (models/tiny.py, models/smollm2.py) are built once into `cache_root()` ($AGENTGYM_CACHE,
else ~/.cache/agentgym-mini), each into a private temporary directory first, then renamed into place by
`publish`, so several ranks building at once end with one build.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path


def cache_root() -> Path:
    return Path(os.environ.get("AGENTGYM_CACHE", Path.home() / ".cache" / "agentgym-mini"))


def publish(tmp: Path, final: Path) -> str:
    """Rename a finished build into place; if another rank got there first, its identical build wins."""
    try:
        tmp.rename(final)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
    return str(final)
