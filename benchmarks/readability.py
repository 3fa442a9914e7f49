"""How readable is each notebook's prose? Words per sentence over its Markdown cells.

    .venv/bin/python benchmarks/readability.py [notebooks/NN_name.ipynb ...]

Prints, per notebook, the mean words per sentence, the share of sentences over 30 words and the longest
sentence. Exit status 1 if any notebook breaks a limit: a mean over 20 words, more than 10% of sentences over
30 words, or any sentence over 45 words. ``tests/test_readability.py`` applies the same limits.

How the text is read, so that anyone gets the same numbers:

- fenced code blocks and HTML comments are dropped; a code span or a formula counts as one word;
- a link counts as its text, a bare URL is dropped;
- headings, list items, table cells, ``<summary>`` titles and paragraphs each end a sentence;
- a sentence ends at ``.``, ``!`` or ``?`` followed by a space, except after abbreviations such as "e.g.";
- a word is a run of characters holding at least one letter or digit.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))

MAX_MEAN_WORDS = 20.0  # mean words per sentence
LONG_SENTENCE_WORDS = 30  # a sentence longer than this is "long"
MAX_LONG_SHARE = 0.10  # at most this share of sentences may be long
MAX_SENTENCE_WORDS = 45  # no sentence may be longer than this

ABBREVIATIONS = ("e.g.", "i.e.", "vs.", "etc.", "et al.", "cf.", "approx.", "Fig.", "fig.", "No.", "Eq.", "eq.")
_PLACEHOLDER = "\u2024"  # one-dot leader: stands in for an abbreviation's dots while splitting


@dataclass(frozen=True)
class Readability:
    """Sentence statistics of one text (or notebook)."""

    sentences: int
    mean_words: float
    long_share: float  # share of sentences over LONG_SENTENCE_WORDS
    longest: str

    @property
    def longest_words(self) -> int:
        return count_words(self.longest)

    def problems(self) -> list[str]:
        """What breaks the limits, in words; empty when the text meets them all."""
        found = []
        if self.mean_words > MAX_MEAN_WORDS:
            found.append(f"{self.mean_words:.1f} words per sentence on average (at most {MAX_MEAN_WORDS:.0f})")
        if self.long_share > MAX_LONG_SHARE:
            found.append(f"{self.long_share:.0%} of sentences over {LONG_SENTENCE_WORDS} words "
                         f"(at most {MAX_LONG_SHARE:.0%})")
        if self.longest_words > MAX_SENTENCE_WORDS:
            found.append(f"a sentence of {self.longest_words} words (at most {MAX_SENTENCE_WORDS}): "
                         f"{self.longest!r}")
        return found


def markdown_cells(path: Path) -> list[str]:
    """The source of each Markdown cell of the notebook at ``path``, in order."""
    notebook = json.loads(Path(path).read_text())
    return ["".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            for cell in notebook["cells"] if cell["cell_type"] == "markdown"]


def _plain(markdown: str) -> str:
    """Markdown with code, formulas, links and tags reduced to the words a reader reads."""
    text = re.sub(r"```.*?```", "\n\n", markdown, flags=re.S)
    text = re.sub(r"<!--.*?-->", " ", text, flags=re.S)
    text = re.sub(r"``?[^`]+?``?", "code", text)  # a span may wrap onto the next line
    text = re.sub(r"\$\$.+?\$\$", "\n\nformula\n\n", text, flags=re.S)
    text = re.sub(r"\$[^$\n]+\$", "formula", text)
    text = re.sub(r"!\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"https?://\S+", " ", text)
    text = re.sub(r"</?summary>", "\n\n", text, flags=re.I)  # a summary is a title: its own sentence
    text = re.sub(r"</?(details|br|p|div)\b[^>]*>", "\n\n", text, flags=re.I)
    text = re.sub(r"<[^>\n]+>", " ", text)
    return text


def _blocks(text: str) -> list[str]:
    """Pieces of text that end a sentence at their end: paragraphs, headings, list items, table cells."""
    pieces = []
    for paragraph in re.split(r"\n\s*\n", text):
        current: list[str] = []
        for line in paragraph.splitlines():
            stripped = line.strip()
            if re.fullmatch(r"\|?[\s:|-]*-[\s:|-]*\|?", stripped):  # a table's rule
                continue
            if stripped.startswith("|"):
                pieces.append(" ".join(current))
                current = []
                pieces.extend(cell for cell in stripped.strip("|").split("|"))
            elif re.match(r"#+\s", stripped):  # a heading is a sentence on its own
                pieces.extend([" ".join(current), re.sub(r"^#+\s*(\d+[.)]\s+)?", "", stripped)])
                current = []
            elif re.match(r"([-*+]\s|\d+[.)]\s|>\s*)", stripped):
                pieces.append(" ".join(current))
                current = [re.sub(r"^([-*+]|\d+[.)]|>)\s*", "", stripped)]
            else:
                current.append(stripped)
        pieces.append(" ".join(current))
    return [piece.strip() for piece in pieces if count_words(piece)]


def sentences(markdown: str) -> list[str]:
    """The sentences of a Markdown text, as a reader meets them."""
    found = []
    for block in _blocks(_plain(markdown)):
        for abbreviation in ABBREVIATIONS:
            block = block.replace(abbreviation, abbreviation.replace(".", _PLACEHOLDER))
        for sentence in re.split(r"(?<=[.!?])[\"')\]*_]*\s+", block):
            sentence = " ".join(sentence.replace(_PLACEHOLDER, ".").split())
            if count_words(sentence):
                found.append(sentence)
    return found


def count_words(text: str) -> int:
    """Words in ``text``: runs without spaces that hold a letter or a digit."""
    return sum(1 for token in text.split() if re.search(r"\w", token))


def measure(texts: list[str]) -> Readability:
    """Sentence statistics over several Markdown texts together (e.g. a notebook's cells)."""
    found = [sentence for text in texts for sentence in sentences(text)]
    if not found:
        raise ValueError("no sentences to measure: expected Markdown text with at least one word, got none")
    lengths = [count_words(sentence) for sentence in found]
    return Readability(
        sentences=len(found),
        mean_words=sum(lengths) / len(found),
        long_share=sum(length > LONG_SENTENCE_WORDS for length in lengths) / len(found),
        longest=max(found, key=count_words),
    )


def measure_notebook(path: Path) -> Readability:
    """Sentence statistics over the Markdown cells of the notebook at ``path``."""
    return measure(markdown_cells(path))


def main(argv: list[str]) -> int:
    paths = [Path(arg) for arg in argv] or NOTEBOOKS
    failed = 0
    print(f"{'notebook':<40} {'sentences':>9} {'words/sentence':>14} {'over 30':>8} {'longest':>7}")
    for path in paths:
        result = measure_notebook(path)
        problems = result.problems()
        failed += bool(problems)
        print(f"{path.name:<40} {result.sentences:>9} {result.mean_words:>14.1f} {result.long_share:>8.0%} "
              f"{result.longest_words:>7}  {'ok' if not problems else 'OVER'}")
        for problem in problems:
            print(f"    {problem}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
