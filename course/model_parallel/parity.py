"""The parity table: is a split run's loss different from one process's because of a bug, or because of rounding?

Every strategy trains the course's transformer for a few SGD steps on the same global batches, on 4 ranks
(:mod:`course.model_parallel.parity_ranks`). One process trains it too, and derives for each strategy how far its
loss may be at each step for rounding alone (:mod:`course.model_parallel.loss_bound`). The table prints each loss
beside the one-process loss, the largest difference seen, the bound, and whether the difference is inside it::

    strategy                  ranks                   loss, step 4  one process  largest diff     bound  verdict
    data parallel             4 data                      3.085108     3.085108       2.4e-07   1.3e-05  inside
    summed gradients (a bug)  4 data                      2.643804     3.085108       5.7e-01   1.3e-05  OUTSIDE ...

Run from a terminal in the repository: ``python -m course.model_parallel.parity`` (all strategies, under two
minutes on 2 cores), ``--steps 2`` for fewer steps, ``--strategies "data parallel" FSDP`` for some.
Taught in ``notebooks/08_tensor_pipeline.ipynb``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from course.model_parallel import transformer
from course.model_parallel.loss_bound import Layout, Training, reference
from course.model_parallel.parity_ranks import train_on_rank
from course.numerics.bounds import Verdict, verdict
from course.runtime.launch import launch

WORLD_SIZE = 4  # ranks every strategy runs on (the pipeline: one block per rank)
CONFIG = transformer.Config(num_layers=WORLD_SIZE)

#: how each strategy cuts the arithmetic on 4 ranks: the tensor-parallel size, and the partial sums of a gradient
LAYOUTS: dict[str, tuple[Layout, str]] = {
    "data parallel": (Layout(pieces=4), "4 data"),
    "ZeRO-1": (Layout(pieces=4), "4 data, state sharded"),
    "FSDP": (Layout(pieces=4), "4 data, all sharded"),
    "tensor parallel": (Layout(tensor_parallel=4), "4 tensor"),
    "sequence parallel": (Layout(tensor_parallel=4, pieces=4), "4 tensor + sequence"),
    "pipeline (1F1B)": (Layout(pieces=4), "4 stages, 4 micro"),
    "tensor x data (2 x 2)": (Layout(tensor_parallel=2, pieces=2), "2 tensor x 2 data"),
    "summed gradients (a bug)": (Layout(pieces=4), "4 data"),
}
CORRECT = tuple(name for name in LAYOUTS if "bug" not in name)


@dataclass(frozen=True)
class Row:
    """One strategy's losses beside one process's, and the verdict: bug or rounding."""

    strategy: str
    ranks: str
    losses: list[float]
    reference: list[float]
    bound: list[float]

    @property
    def judged(self) -> Verdict:
        """The verdict on the step furthest beyond its bound (or, when none is, nearest to it)."""
        return verdict(torch.tensor(self.losses, dtype=torch.float64),
                       torch.tensor(self.reference, dtype=torch.float64), torch.tensor(self.bound))

    @property
    def inside(self) -> bool:
        return self.judged.within

    @property
    def first_outside(self) -> int | None:
        """The first step whose loss is beyond its bound (None: none is)."""
        return next((t for t, (got, want, b) in enumerate(zip(self.losses, self.reference, self.bound, strict=True))
                     if abs(got - want) > b), None)


def check_names(names: Sequence[str]) -> tuple[str, ...]:
    """``names`` as a tuple, each a key of :data:`LAYOUTS`.

    Raises:
        ValueError: naming an unknown strategy and listing the known ones.
    """
    unknown = [name for name in names if name not in LAYOUTS]
    if unknown or not names:
        raise ValueError(f"expected strategies among {', '.join(map(repr, LAYOUTS))}, got {list(names)}: "
                         "spell them as listed.")
    return tuple(names)


def table(names: Sequence[str] = CORRECT, training: Training | None = None, timeout_s: float = 240.0) -> list[Row]:
    """Train each strategy of ``names`` on 4 ranks and one process as ``training`` says (default: ``Training()``);
    one :class:`Row` each.

    Raises:
        ValueError: an unknown strategy (:func:`check_names`).
    """
    names, training = check_names(names), training or Training()
    layouts = sorted({LAYOUTS[name][0] for name in names}, key=lambda x: (x.tensor_parallel, x.pieces))
    one = reference(CONFIG, training, layouts)
    runs = launch(train_on_rank, WORLD_SIZE, CONFIG, training, names, timeout_s=timeout_s)
    return [Row(name, LAYOUTS[name][1], runs[0][name], one.losses, one.bound[LAYOUTS[name][0]]) for name in names]


def format_table(rows: Sequence[Row]) -> str:
    """The rows as text: the last step's loss beside one process's, the largest difference, its bound, the verdict."""
    steps = len(rows[0].losses) if rows else 0
    lines = [f"{'strategy':<26}{'ranks':<23}{f'loss, step {steps}':>13}{'one process':>13}{'largest diff':>14}"
             f"{'bound':>10}  verdict"]
    for row in rows:
        judged, first = row.judged, row.first_outside
        word = "inside" if first is None else f"OUTSIDE from step {first + 1}: a bug"
        lines.append(f"{row.strategy:<26}{row.ranks:<23}{row.losses[-1]:>13.6f}{row.reference[-1]:>13.6f}"
                     f"{judged.seen:>14.1e}{judged.bound:>10.1e}  {word}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m course.model_parallel.parity [--steps N] [--strategies NAME ...] [--with-bug]``: print the
    table; exit 1 when a correct strategy lands outside its bound."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=Training.steps, help="SGD steps (default %(default)s)")
    parser.add_argument("--strategies", nargs="+", default=list(CORRECT), metavar="NAME",
                        help=f"some of: {', '.join(LAYOUTS)}")
    parser.add_argument("--with-bug", action="store_true", help="add data parallelism with a planted bug")
    args = parser.parse_args(argv)
    names = [*args.strategies, *(["summed gradients (a bug)"] if args.with_bug else [])]
    try:
        rows = table(check_names(names), Training(steps=args.steps))
    except ValueError as error:
        parser.error(str(error))
    print(format_table(rows))
    return 0 if all(row.inside for row in rows if row.strategy in CORRECT) else 1


if __name__ == "__main__":
    raise SystemExit(main())
