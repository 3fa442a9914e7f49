"""The validation protocol: model every published figure of :mod:`course.perf.figures`, score the fitting set and
the test set apart, and fit constants on the fitting set only.

For each :class:`~course.perf.figures.TrainingFigure` the model builds the run's cluster and plan from the
figure's setup (nothing else), models one step (:func:`course.perf.parallel.step_time`) and reports the figure's
own metric: tokens per second per GPU, step seconds, TFLOP/s per GPU counted as the source counts it (hardware
FLOPs with recomputation, or model FLOPs without), or MFU. :func:`score` gives the share within 15% and within
20%, the mean absolute error and the bias (mean signed error).

:func:`fit` is the only way a constant is chosen from end-to-end figures, and it refuses any figure of the test
set: passing one raises. Taught in ``notebooks/05c_performance_model.ipynb``; ``benchmarks/perf_model.py`` prints
both scores.

**The ledger** (:func:`record`, :func:`looks`): each time a changed model scores the test set, one line goes into
``benchmarks/results/perf_test_ledger.md`` (``benchmarks/perf_model.py --record``): the date, the model's
:func:`fingerprint`, what changed, and the scores. A test fails when the model in the tree has no line there, so
the number of looks the test set has had is counted, not remembered.

A figure records its context- and expert-parallel sizes; :func:`plan_of` passes both to
:class:`course.perf.parallel.Plan` (a mixture of experts is a :class:`~course.perf.transformer.Transformer` with
``experts``). Extension point: a module that models more passes its own step function to :func:`predict`.
"""

from __future__ import annotations

import datetime
import hashlib
import math
import statistics
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from course.perf import catalog, figures, microbench, parallel
from course.perf.comm import Cluster
from course.perf.figures import TrainingFigure
from course.perf.sharding import ALL_TERMS, Terms

INTRA = {"Volta": "NVSwitch (V100 DGX-2, NVLink 2)", "Ampere": "NVSwitch (A100, NVLink 3)",
         "Hopper": "NVSwitch (H100, NVLink 4)"}


@dataclass(frozen=True)
class Prediction:
    """One figure beside what the model says for its setup."""

    figure: TrainingFigure
    modelled: float
    step: parallel.TransformerStep

    @property
    def error(self) -> float:
        """Signed relative error: +0.10 means the model says 10% more than published (for a step time: slower)."""
        return self.modelled / self.figure.value - 1


def cluster_of(figure: TrainingFigure) -> Cluster:
    """The figure's cluster: its GPUs on their generation's NVSwitch, its network adapters per node."""
    gpu = catalog.gpu(figure.gpu)
    network = catalog.link(figure.network)
    if figure.transport:
        network = network.over(figure.transport)
    return Cluster(gpu, catalog.link(INTRA[gpu.generation]), figure.gpus_per_node, network, figure.nics)


def plan_of(figure: TrainingFigure) -> parallel.Plan:
    """The figure's plan: parallel sizes, batch, precision, recomputation, sharding, schedule, stated options."""
    return parallel.Plan(figure.tensor, figure.pipeline, figure.data, figure.global_batch, figure.microbatch,
                         figure.sharding, figure.interleave, figure.recompute, figure.precision, figure.context,
                         figure.stage_layers, expert=figure.expert, **dict(figure.options))


def modelled_value(figure: TrainingFigure, step: parallel.TransformerStep) -> float:
    """The figure's metric from a modelled step."""
    tokens = figure.global_batch * figure.model.seq
    return {"tokens_per_gpu_s": tokens / step.step_s / figure.gpus, "step_s": step.step_s,
            "tflops_hardware": step.flops_per_gpu / 1e12, "tflops_model": step.model_flops_per_gpu / 1e12,
            "mfu": step.mfu}[figure.metric]


def predict(figure: TrainingFigure, terms: Terms = ALL_TERMS,
            step_time: Callable[..., parallel.TransformerStep] = parallel.step_time) -> Prediction:
    """Model ``figure``'s run with the defaults (and ``terms``); ``step_time(model, plan, cluster, terms)`` is
    :func:`course.perf.parallel.step_time` unless a module that models more passes its own."""
    step = step_time(figure.model, plan_of(figure), cluster_of(figure), terms)
    return Prediction(figure, modelled_value(figure, step), step)


def score(predictions: Iterable[Prediction]) -> dict[str, float]:
    """``{"figures", "within_15", "within_20", "mae", "bias"}``: the share of figures within 15% and 20%, the mean
    absolute error and the mean signed error.

    Raises:
        ValueError: no predictions.
    """
    errors = [p.error for p in predictions]
    if not errors:
        raise ValueError("no predictions to score: pass predict() of at least one figure.")
    n = len(errors)
    return {"figures": n, "within_15": sum(abs(e) <= 0.15 for e in errors) / n,
            "within_20": sum(abs(e) <= 0.20 for e in errors) / n,
            "mae": sum(map(abs, errors)) / n, "bias": sum(errors) / n}


def fit(chosen: Iterable[TrainingFigure], candidates: Iterable[float], apply: Callable[[float], object],
        terms: Terms = ALL_TERMS) -> float:
    """The candidate value whose model (with ``terms``) has the smallest mean absolute log error on ``chosen``, all of
    the fitting set. ``apply(value)`` is a context manager that sets the constant while the figures are modelled.

    Raises:
        ValueError: a figure of the test set (the protocol's one rule), or no figures.
    """
    chosen = list(chosen)
    leaked = [f.label for f in chosen if f.split != "fit"]
    if leaked or not chosen:
        raise ValueError(f"fit() takes figures of the fitting set only; got {len(leaked)} of the test set "
                         f"({leaked[:2]}) among {len(chosen)}. Fix: pass figures.of_split('fit').")
    def loss(value: float) -> float:
        with apply(value):
            return sum(abs(math.log(predict(f, terms).modelled / f.value)) for f in chosen) / len(chosen)
    return min(candidates, key=loss)


@contextmanager
def training_efficiency_set(generation: str, value: float) -> Iterator[None]:
    """Set :data:`course.perf.microbench.TRAINING_EFFICIENCY` of ``generation`` to ``value`` inside the block."""
    saved = dict(microbench.TRAINING_EFFICIENCY)
    microbench.TRAINING_EFFICIENCY[generation] = value
    try:
        yield
    finally:
        microbench.TRAINING_EFFICIENCY.clear()
        microbench.TRAINING_EFFICIENCY.update(saved)


#: The values :func:`fit_training_efficiency` tries: 0.50 to 1.00 in steps of 0.01.
CANDIDATES = tuple(round(0.5 + i / 100, 2) for i in range(51))


def fit_training_efficiency(generation: str, fitting: Iterable[TrainingFigure] | None = None,
                            terms: Terms = ALL_TERMS) -> float:
    """The sustained fraction of the microbenchmark rates (:data:`course.perf.microbench.TRAINING_EFFICIENCY`) of
    ``generation`` that best predicts the fitting set's figures on that generation (:func:`fit`).

    Raises:
        ValueError: no fitting figure on that generation, or a test figure among ``fitting``.
    """
    chosen = figures.of_split("fit") if fitting is None else fitting
    mine = [f for f in chosen if catalog.gpu(f.gpu).generation == generation]
    return fit(mine, CANDIDATES, lambda value: training_efficiency_set(generation, value), terms)


GENERATIONS = ("Ampere", "Hopper")  # the generations with figures in the fitting set


@dataclass(frozen=True)
class Ablation:
    """The protocol run with one term off: the constants refitted on the fitting set, then both sets scored."""

    term: str                  # the term switched off, or "none" for the model as it is
    fitted: dict[str, float]   # the sustained fraction refitted per generation
    fit: dict[str, float]      # score() of the fitting set
    test: dict[str, float]     # score() of the test set


def ablation(term: str | None = None) -> Ablation:
    """Switch ``term`` (a field of :class:`~course.perf.sharding.Terms`) off, refit the per-generation constant on
    the fitting set with it off, and score both sets: how much the term moves the test score, fairly.

    Raises:
        ValueError: not a term's name.
    """
    names = tuple(Terms.__dataclass_fields__)
    if term is not None and term not in names:
        raise ValueError(f"term must be one of {names} (or None), got {term!r}.")
    terms = replace(ALL_TERMS, **{term: False}) if term else ALL_TERMS
    fitted = {g: fit_training_efficiency(g, terms=terms) for g in GENERATIONS}
    saved = dict(microbench.TRAINING_EFFICIENCY)
    microbench.TRAINING_EFFICIENCY.update(fitted)
    try:
        scores = {split: score(predict(f, terms) for f in figures.of_split(split)) for split in ("fit", "test")}
    finally:
        microbench.TRAINING_EFFICIENCY.clear()
        microbench.TRAINING_EFFICIENCY.update(saved)
    return Ablation(term or "none", fitted, scores["fit"], scores["test"])


def typical_error(split: str = "test") -> float:
    """The median absolute error over the figures of ``split``: the "typically within X%" the course quotes
    beside a modelled number (from the test set: figures no constant was fitted to)."""
    errors = sorted(abs(predict(f).error) for f in figures.of_split(split))
    return statistics.median(errors)


#: The test-set ledger: one line per model that scored the test set (module docstring).
LEDGER = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "perf_test_ledger.md"
_ROW = "| {date} | `{fingerprint}` | {change} | {fit:.0%} | {t15:.0%} | {t20:.0%} | {mae:.1%} | {bias:+.1%} |"


def fingerprint() -> str:
    """A short hash of the model as it stands, computed without the test set's predictions: the fitting set's
    modelled values, the fitted constants, the terms and every figure's setup (test figures' setups included).
    Any change to the model's physics or constants moves the fitting set's values, so it moves this."""
    fitted = [f"{predict(f).modelled:.6g}" for f in figures.of_split("fit")]
    parts = (fitted, sorted(microbench.TRAINING_EFFICIENCY.items()), ALL_TERMS, figures.FIGURES)
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:12]


def recorded(path: Path = LEDGER) -> list[str]:
    """The fingerprints the ledger holds, one per look, oldest first (none when the file does not exist)."""
    if not path.exists():
        return []
    return [line.split("`")[1] for line in path.read_text().splitlines() if line.startswith("| 20")]


def looks(path: Path = LEDGER) -> int:
    """How many times a changed model has scored the test set, as the ledger records it."""
    return len(recorded(path))


def record(change: str, path: Path = LEDGER) -> str:
    """Score both sets with the model as it stands and append one line to the ledger: date, :func:`fingerprint`,
    ``change`` (what changed since the last line), the fitting set's share within 15%, and the test set's scores.
    Returns the line. Called by ``benchmarks/perf_model.py --record``.

    Raises:
        ValueError: an empty ``change``, a ``|`` in it, or a model already in the ledger (nothing new to record).
    """
    if not change.strip() or "|" in change:
        raise ValueError(f"change must say, in words without '|', what changed since the last look; got {change!r}.")
    mark = fingerprint()
    if mark in recorded(path):
        raise ValueError(f"the model {mark} already scored the test set (see {path.name}); change it first.")
    fit_score = score(predict(f) for f in figures.of_split("fit"))
    test = score(predict(f) for f in figures.of_split("test"))
    line = _ROW.format(date=datetime.date.today().isoformat(), fingerprint=mark, change=change.strip(),
                       fit=fit_score["within_15"], t15=test["within_15"], t20=test["within_20"], mae=test["mae"],
                       bias=test["bias"])
    with path.open("a") as ledger:
        ledger.write(line + "\n")
    return line
