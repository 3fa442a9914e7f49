"""A character corpus generated from a small grammar: text to train the tiny transformer on, nothing downloaded.

Sentences like ``"the small fox sees a red bird."`` are drawn from a seeded grammar (:func:`sentences`), so the
text has structure a model can learn in seconds (articles before nouns, a verb in the middle, a full stop) and is
the same on every rank and every run. :class:`Vocabulary` maps characters to token ids; :func:`batch` cuts
``(inputs, targets)`` windows, targets shifted one character on. Taught in ``notebooks/08_tensor_pipeline.ipynb``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from course.arguments import check_count

ARTICLES = ("the", "a", "one", "every")
ADJECTIVES = ("small", "red", "quick", "old", "quiet", "green")
NOUNS = ("fox", "dog", "bird", "cat", "horse", "child")
VERBS = ("sees", "chases", "likes", "follows", "hears")


def vocabulary() -> Vocabulary:
    """The grammar's characters (its words, space and the full stop): the same ids for every text it makes."""
    return Vocabulary.of(" ." + "".join(ARTICLES + ADJECTIVES + NOUNS + VERBS))


def sentences(count: int, seed: int = 0) -> str:
    """``count`` sentences of the grammar ``article [adjective] noun verb article [adjective] noun.``, joined by
    spaces; the same text for the same ``seed``.

    Raises:
        ValueError: count below 1.
    """
    count = check_count("count", count, unit="number of sentences")
    rng = random.Random(seed)

    def phrase() -> str:
        words = [rng.choice(ARTICLES)] + ([rng.choice(ADJECTIVES)] if rng.random() < 0.5 else [])
        return " ".join([*words, rng.choice(NOUNS)])

    return " ".join(f"{phrase()} {rng.choice(VERBS)} {phrase()}." for _ in range(count))


@dataclass(frozen=True)
class Vocabulary:
    """The characters of a text, each with an id (sorted, so the same text gives the same ids)."""

    characters: str

    @classmethod
    def of(cls, text: str) -> Vocabulary:
        return cls("".join(sorted(set(text))))

    @property
    def size(self) -> int:
        return len(self.characters)

    def encode(self, text: str) -> torch.Tensor:
        """``(len(text),)`` int64 token ids.

        Raises:
            ValueError: a character outside the vocabulary.
        """
        index = {c: i for i, c in enumerate(self.characters)}
        unknown = sorted(set(text) - set(index))
        if unknown:
            raise ValueError(f"characters {unknown} are not in the vocabulary {self.characters!r}: build the "
                             "vocabulary from a text that contains them (Vocabulary.of(text)).")
        return torch.tensor([index[c] for c in text], dtype=torch.int64)

    def decode(self, tokens: torch.Tensor) -> str:
        return "".join(self.characters[int(t)] for t in tokens)


def batch(tokens: torch.Tensor, batch_size: int, seq_len: int, generator: torch.Generator | None = None
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch_size`` random windows of ``seq_len`` tokens and the same windows one token on.

    Args:
        tokens: ``(T,)`` token ids, ``T > seq_len``.
        generator: picks the window starts (a seeded one gives the same batch on every rank).

    Returns:
        ``(inputs, targets)``, both ``(batch_size, seq_len)`` int64.

    Raises:
        ValueError: a batch size or length below 1, or a text not longer than ``seq_len``.
    """
    batch_size = check_count("batch_size", batch_size, unit="number of sequences")
    seq_len = check_count("seq_len", seq_len, unit="number of tokens", maximum=len(tokens) - 1)
    starts = torch.randint(len(tokens) - seq_len, (batch_size,), generator=generator)
    windows = torch.stack([tokens[s:s + seq_len + 1] for s in starts.tolist()])
    return windows[:, :-1], windows[:, 1:]
