"""Retrievers of the deep-search env: a list of passages in, the indices of the top-k passages of a query out.

    class Retriever(Protocol):
        def search(self, query: str, k: int) -> list[int]: ...

- `BM25` (the default): lexical retrieval with `bm25s` (numpy only, fast: docs/environments.md);
  only passages with a positive score are returned, so a query of unknown words finds nothing.
- `Dense`: the paper's kind of retrieval (it used e5 over the 2018 Wikipedia dump). A user-supplied
  encoder (any HF model directory or name; `tiny` for tests) embeds text by mean pooling its last
  hidden states over the attention mask, L2-normalised, with e5's "query: " / "passage: " prefixes by
  default; the score is the dot product (cosine), computed as one torch matmul against the whole
  index, top-k by `torch.topk`. The index is a `.pt` file holding a (passages, dim) float tensor whose
  row i embeds passage i, e.g. precomputed on a GPU; without one, the corpus is encoded here once
  (and saved in `cache_dir` when given). No faiss: a flat matmul is exact and fast enough on CPU for
  corpora of up to a few hundred thousand passages (memory: passages x dim x 4 bytes).

torch and transformers are imported only when a dense retriever is built. Tests: tests/test_searchqa.py.
"""
from __future__ import annotations

import zlib
from pathlib import Path
from typing import Protocol

import bm25s

MAX_QUERY_CHARS = 500  # guards the tokenizer against 100k-character replies


class Retriever(Protocol):
    def search(self, query: str, k: int) -> list[int]:
        """Indices into the passage list of the best passages for `query`, best first, at most k."""


class BM25:
    def __init__(self, contents: list[str], key: str, cache_dir: str | None = None):
        saved = Path(cache_dir) / f"bm25-{zlib.crc32(key.encode()):08x}" if cache_dir else None
        if saved is not None and (saved / "params.index.json").exists():
            self.index = bm25s.BM25.load(str(saved))
        else:
            self.index = bm25s.BM25()
            self.index.index(bm25s.tokenize(contents, stopwords="en", show_progress=False), show_progress=False)
            if saved is not None:
                self.index.save(str(saved))
        self.size = len(contents)

    def search(self, query: str, k: int) -> list[int]:
        tokens = bm25s.tokenize([query[:MAX_QUERY_CHARS]], stopwords="en", return_ids=False, show_progress=False)[0]
        # Tokens unknown to the index would be ignored anyway; an empty query scores every passage 0.
        tokens = [t for t in tokens if t in self.index.vocab_dict]
        if not tokens:
            return []
        ids, scores = self.index.retrieve([tokens], k=min(k, self.size), show_progress=False, n_threads=1)
        return [int(i) for i, s in zip(ids[0], scores[0]) if s > 0]


class Dense:
    def __init__(self, contents: list[str], encoder: str, index: str | None = None, cache_dir: str | None = None,
                 key: str = "", query_prefix: str = "query: ", passage_prefix: str = "passage: ",
                 batch_size: int = 64, max_length: int = 256):
        import torch
        from transformers import AutoModel, AutoTokenizer

        from models import resolve_model

        path = resolve_model(encoder)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModel.from_pretrained(path, dtype=torch.float32).eval()
        self.query_prefix, self.max_length = query_prefix, max_length
        saved = (Path(cache_dir) / f"dense-{zlib.crc32(f'{key}|{encoder}|{passage_prefix}'.encode()):08x}.pt"
                 if cache_dir and not index else None)
        if index:
            self.matrix = torch.load(index, map_location="cpu", weights_only=True)
        elif saved is not None and saved.exists():
            self.matrix = torch.load(saved, map_location="cpu", weights_only=True)
        else:
            texts = [passage_prefix + c for c in contents]
            self.matrix = torch.cat([self.embed(texts[i:i + batch_size]) for i in range(0, len(texts), batch_size)])
            if saved is not None:
                saved.parent.mkdir(parents=True, exist_ok=True)
                torch.save(self.matrix, saved)
        if self.matrix.ndim != 2 or len(self.matrix) != len(contents):
            raise ValueError(f"the dense index {index or saved} has shape {tuple(self.matrix.shape)}; it needs one "
                             f"row per passage ({len(contents)} rows, one embedding each)")
        self.matrix = self.matrix.float()

    def embed(self, texts: list[str]):
        """(len(texts), dim) L2-normalised mean-pooled embeddings."""
        import torch

        batch = self.tokenizer(texts, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt")
        with torch.no_grad():
            hidden = self.model(**batch).last_hidden_state                       # (B, T, D)
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)           # (B, T, 1)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1)              # (B, D)
        return torch.nn.functional.normalize(pooled, dim=-1)

    def search(self, query: str, k: int) -> list[int]:
        import torch

        if not query.strip():
            return []
        scores = self.matrix @ self.embed([self.query_prefix + query[:MAX_QUERY_CHARS]])[0]  # (N,)
        return torch.topk(scores, min(k, len(scores))).indices.tolist()
