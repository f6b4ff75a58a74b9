"""Swap-KL prompts: P windows of T tokens cut deterministically from a corpus's prompt region."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from swapkl.scoring.corpora import Corpus
from swapkl.errors import ContractError

_TOKEN_CACHE: dict[tuple, list[int]] = {}


@dataclass
class Prompts:
    """``ids``: LongTensor [P, T] of token ids (no padding: every window is T real tokens)."""

    ids: torch.Tensor
    description: dict

    @property
    def num_prompts(self) -> int:
        return self.ids.shape[0]

    @property
    def num_tokens(self) -> int:
        return self.ids.shape[1]


def adds_bos(tokenizer) -> bool:
    """Whether the tokenizer's default encoding starts with its BOS token (Llama: yes; GPT-2/NeoX: no)."""
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None:
        return False
    ids = tokenizer("a")["input_ids"]
    return bool(ids) and ids[0] == bos


def tokenize_stream(tokenizer, text: str) -> list[int]:
    key = (getattr(tokenizer, "name_or_path", ""), len(tokenizer), hash(text))
    if key not in _TOKEN_CACHE:
        ids: list[int] = []
        # tokenise in paragraphs of ~2k words so a huge text never makes one giant encode call
        words = text.split(" ")
        step = 2000
        for k in range(0, len(words), step):
            chunk = " ".join(words[k:k + step])
            if k:
                chunk = " " + chunk
            ids.extend(tokenizer(chunk, add_special_tokens=False)["input_ids"])
        _TOKEN_CACHE.clear()
        _TOKEN_CACHE[key] = ids
    return _TOKEN_CACHE[key]


def make_prompts(tokenizer, corpus: Corpus, num_prompts: int, num_tokens: int, seed: int = 0,
                 bos: str = "auto") -> Prompts:
    """Cut ``num_prompts`` non-overlapping windows of ``num_tokens`` tokens from ``corpus.prompt_text()``.

    The windows are drawn (seeded, without replacement) from the consecutive non-overlapping windows of the
    token stream.  With BOS, each window is BOS + (T-1) text tokens.
    """
    use_bos = adds_bos(tokenizer) if bos == "auto" else bos == "yes"
    if use_bos and tokenizer.bos_token_id is None:
        raise ContractError("bos=yes but the tokenizer has no BOS token")
    body = num_tokens - (1 if use_bos else 0)
    stream = tokenize_stream(tokenizer, corpus.prompt_text())
    n_windows = len(stream) // body
    if n_windows < num_prompts:
        raise ContractError(
            f"corpus {corpus.name} is too short: its prompt region has {len(stream)} tokens, room for "
            f"{n_windows} windows of {num_tokens} tokens; {num_prompts} prompts were asked for"
        )
    rng = np.random.default_rng(seed)
    starts = (rng.choice(n_windows, size=num_prompts, replace=False) * body).tolist()
    rows = [stream[s:s + body] for s in starts]
    if use_bos:
        rows = [[tokenizer.bos_token_id] + r for r in rows]
    ids = torch.tensor(rows, dtype=torch.long)
    desc = {"corpus": corpus.describe(), "region": "prompt region (after the evaluation region)",
            "window_starts": starts, "bos": use_bos, "seed": seed}
    return Prompts(ids=ids, description=desc)
