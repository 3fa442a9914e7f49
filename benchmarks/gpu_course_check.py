"""One command for a GPU machine: does the whole course run there, and how do its measurements compare with the model?

    PYTHONPATH=. python benchmarks/gpu_course_check.py [--wheels DIR] [--out FILE]      (or: make gpu-check)
    PYTHONPATH=. python benchmarks/gpu_course_check.py --emulate                       (the CPU dry run)

Runs, each step timed, its outcome recorded and a failure never stopping the next (the quick steps 3-6 first,
so a time limit cuts only notebooks):

1. environment: the GPUs, driver, torch and CUDA versions, and ``course info`` (ranks, backend, GPU links);
2. notebooks: every notebook under nbval, on the GPUs present (skipped, saying so, where nbval is not installed:
   ``--wheels DIR`` first installs nbval, ipykernel and ipywidgets from a folder of wheels, with no network);
3. labs: every lab's reference solution through its check, hidden runs included (full marks expected);
4. grader: the reference assignment (full marks) and two broken scripts, each of which must fail exactly the
   check its bug breaks;
5. gpu_check: ``benchmarks/gpu_check.py``, a DDP step and an allreduce sweep, measured against ``course.perf``;
6. the 2-GPU path (on 2 or more GPUs): with only two GPUs visible, ``world.plan(4)`` must choose 2 ranks on nccl,
   and notebooks 00 and 08 run under nbval so (skipped, saying so, on fewer GPUs or in the dry run).

It writes ONE markdown file (default ``benchmarks/results/gpu-check-<GPU>-<date>.md``), rewritten after each step
so that a run cut short keeps what it did: the GPU, driver, torch and CUDA versions, what passed, and each
measured / modelled ratio. A failed notebook's pytest output goes to ``<file>.failures.log`` beside it. Exit
status 1 if a step failed. Built to take under 10 minutes on one H100. ``--emulate`` runs a small subset on CPU
processes, to check the script itself (the suite runs it: ``tests/benchmarks``, with ``--skip grading``, since the
suite grades that script already); its numbers are CPU numbers and nothing is modelled. ``--skip STEP`` leaves out
the labs, the grading or the notebooks.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.util
import io
import os
import platform
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

import gpu_check  # noqa: E402
import torch  # noqa: E402

from course import cli, world  # noqa: E402

WHEELS = ("nbval", "ipykernel", "ipywidgets")  # what the notebooks need beyond the GPU image
#: submission (tests/submissions) -> the checks it must fail: nothing for the reference, one each for the bugs
GRADED = {"reference": set(), "unscaled_lr": {"lr_scaled"}, "summed_gradients": {"matches_single_process"}}
#: The bugs still train to within a few points of the target accuracy. Which side they land on depends on the
#: evaluation's seed, drawn from the instructor's secret, so their target_accuracy verdict is not part of the check
#: (as in tests/grader/test_submissions.py's NEAR_TARGET).
NEAR_TARGET = {"unscaled_lr", "summed_gradients"}
NOTEBOOK_TIMEOUT_S = 300


@dataclass
class Step:
    """One thing the check ran: ``passed`` None for skipped (``detail`` says why)."""

    name: str
    passed: bool | None
    seconds: float
    detail: str = ""


@dataclass
class Report:
    environment: dict[str, str]
    steps: list[Step] = field(default_factory=list)
    ratios: list[dict] = field(default_factory=list)  # gpu_check's rows: what, measured, modelled, unit

    @property
    def passed(self) -> bool:
        return all(step.passed is not False for step in self.steps)


def timed(name: str, run: Callable[[], tuple[bool | None, str]]) -> Step:
    """Run one step; an exception is that step's failure (its last line), not the end of the check."""
    start = time.monotonic()
    try:
        passed, detail = run()
    except Exception as error:  # noqa: BLE001 - every step is reported, whatever it raised
        passed, detail = False, f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[-1]}"
    step = Step(name, passed, time.monotonic() - start, detail)
    verdict = {True: "PASS", False: "FAIL", None: "SKIP"}[passed]
    print(f"[{verdict}] {name} ({step.seconds:.0f} s) {detail}", flush=True)
    return step


def environment() -> dict[str, str]:
    """GPU names, driver, torch, CUDA and Python versions, and the lines of ``course info``."""
    found = {"python": platform.python_version(), "torch": torch.__version__,
             "CUDA (torch built with)": torch.version.cuda or "none (CPU build)"}
    if torch.cuda.is_available():
        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        found["GPUs"] = f"{len(names)} x {', '.join(sorted(set(names)))}"
        found["driver"] = _driver()
    else:
        found["GPUs"] = "none"
    found["course info"] = "\n".join(cli.info_lines())
    return found


def _driver() -> str:
    try:
        import pynvml

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception as error:  # noqa: BLE001 - no pynvml or no driver access: say so in the report
        return f"unknown ({type(error).__name__})"


def install_wheels(folder: Path) -> tuple[bool | None, str]:
    """pip install what the notebooks need from ``folder`` (no index, no network)."""
    wanted = [name for name in WHEELS if importlib.util.find_spec(name) is None]
    if not wanted:
        return None, "nbval, ipykernel and ipywidgets are already installed"
    result = subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--find-links", str(folder),
                             *wanted], capture_output=True, text=True)
    importlib.invalidate_caches()
    return result.returncode == 0, (f"installed {', '.join(wanted)} from {folder}" if result.returncode == 0
                                    else f"pip failed: {(result.stderr.strip().splitlines() or [''])[-1]}")


def _environment_for_children() -> dict[str, str]:
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), path]))}


def run_notebook(path: Path, failure_log: Path | None = None, env: dict[str, str] | None = None) -> tuple[bool, str]:
    """One notebook under nbval, in a pytest of its own (the repository's pytest options left out), with ``env``
    added to its environment; if it fails, its pytest output is appended to ``failure_log``."""
    command = [sys.executable, "-m", "pytest", str(path), "-o", "addopts=", "-p", "no:cacheprovider", "-q",
               "--nbval-lax", "--nbval-current-env", f"--nbval-cell-timeout={NOTEBOOK_TIMEOUT_S}"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True,
                            env={**_environment_for_children(), **(env or {})}, timeout=3 * NOTEBOOK_TIMEOUT_S)
    summary = (result.stdout.strip().splitlines() or ["no output"])[-1]
    if result.returncode != 0 and failure_log is not None:
        with failure_log.open("a") as log:
            log.write(f"===== {path.name}: {summary}\n{result.stdout[-20000:]}\n{result.stderr[-5000:]}\n")
    return result.returncode == 0, summary


def notebook_steps(notebooks: list[Path], parallel: int, record: Callable[[Step], Step],
                   failure_log: Path | None = None) -> None:
    """Every notebook, ``parallel`` at a time, each step passed to ``record`` as it ends; without nbval, one
    skipped step saying why."""
    if importlib.util.find_spec("nbval") is None or importlib.util.find_spec("ipykernel") is None:
        record(Step("notebooks", None, 0.0, "nbval or ipykernel is not installed here (pass --wheels DIR with "
                                             "their wheels): the notebooks were NOT run"))
        return
    with ThreadPoolExecutor(parallel) as pool:
        list(pool.map(lambda nb: record(timed(f"notebook {nb.name}", lambda: run_notebook(nb, failure_log))),
                      notebooks))


#: Run again with only two GPUs visible, as on Kaggle's two T4s: world.plan(4) then runs 2 ranks on NCCL
TWO_GPU_NOTEBOOKS = ("00_start_here.ipynb", "08_tensor_pipeline.ipynb")


def two_gpus_visible() -> dict[str, str]:
    """The environment that leaves a process the first two of the GPUs this one sees."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    first = visible.split(",")[:2] if visible else ["0", "1"]
    return {"CUDA_VISIBLE_DEVICES": ",".join(first)}


def planned_on_two_gpus() -> tuple[bool, str]:
    """What ``world.plan(4)`` chooses in a process that sees only two GPUs: 2 ranks on nccl expected."""
    probe = ("from course import world; p = world.plan(4); "
             "print(p.world_size, p.backend, ','.join(p.devices)); print(p.sentence)")
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=300,
                            env={**_environment_for_children(), **two_gpus_visible()})
    lines = result.stdout.strip().splitlines() or [f"no output: {result.stderr.strip()[-300:]}"]
    return lines[0] == "2 nccl cuda:0,cuda:1", lines[-1]


def two_gpu_steps(emulate: bool, record: Callable[[Step], Step], failure_log: Path | None = None) -> None:
    """On 2 or more GPUs: the path of a learner with two (``world.plan`` shrinks a 4-rank lesson to 2 ranks on
    nccl), checked by its plan and by :data:`TWO_GPU_NOTEBOOKS` run with only two GPUs visible."""
    gpus = 0 if emulate else torch.cuda.device_count()
    if gpus < 2:
        record(Step("2-GPU path", None, 0.0, f"{'CPU dry run' if emulate else f'{gpus} GPU(s) here'}: "
                                             "it needs 2 or more GPUs, so it was NOT run"))
        return
    if not record(timed("2-GPU path: world.plan(4) with 2 GPUs visible", planned_on_two_gpus)).passed:
        return
    for name in TWO_GPU_NOTEBOOKS:
        record(timed(f"notebook {name} on 2 GPUs",
                     lambda name=name: run_notebook(ROOT / "notebooks" / name, failure_log, two_gpus_visible())))


def check_lab(name: str) -> tuple[bool, str]:
    """The lab's reference solution (grader/labs/<lab>/reference.py) through its check, hidden runs included."""
    from grader.labs import registry
    from grader.labs.core import reference_path, run_lab

    lab = registry.get(name)
    solution = reference_path(lab)
    with contextlib.redirect_stdout(io.StringIO()):
        result = run_lab(lab, str(solution), hidden=True)
    failed = "; ".join(str(f) for f in result.failed())[:300] if not result.passed else ""
    return result.passed, f"{result.score}/{result.max_score}" + (f": {failed}" if failed else "")


def grade_submission(name: str) -> tuple[bool, str]:
    """Grade ``tests/submissions/<name>.py``; it passes when exactly the checks of :data:`GRADED` fail
    (target_accuracy aside for those in :data:`NEAR_TARGET`)."""
    from grader.runner import GradingConfig, grade

    results = grade(ROOT / "tests" / "submissions" / f"{name}.py", GradingConfig())
    failed = {c.name for c in results.checks if not c.passed and c.assessed}
    if name in NEAR_TARGET:
        failed.discard("target_accuracy")
    expected = GRADED[name]
    detail = f"status {results.status}, {results.score:g}/{results.max_score:g}, failed {sorted(failed) or 'none'}"
    return results.status == "ok" and failed == expected, detail + ("" if failed == expected else
                                                                     f" (expected {sorted(expected) or 'none'})")


def measure(emulate: bool, report: Report) -> tuple[bool, str]:
    """benchmarks/gpu_check.py's measurements; the rows go to the report's ratios."""
    sizes = (1 << 16,) if emulate else None
    report.ratios = gpu_check.run(emulate=emulate, sizes=sizes)
    if not report.ratios:
        return None, "no CUDA device: nothing measured"
    return True, f"{len(report.ratios)} measurement(s)"


def check(emulate: bool, wheels: Path | None, notebooks: list[Path], labs: list[str], graded: list[str],
          out: Path | None = None) -> Report:
    """Every step (see the module doc) into a :class:`Report`. With ``out``, the results file is rewritten after
    each step, so a run cut short by a time limit still leaves what it did, and a failed notebook's pytest output
    goes to ``<out>.failures.log``."""
    report = Report(environment())
    mode = world.detect_hardware()
    print(f"gpu-check: {mode.describe(4)}", flush=True)
    lock = threading.Lock()
    failure_log = None if out is None else out.with_name(out.name + ".failures.log")
    if failure_log is not None:
        failure_log.unlink(missing_ok=True)

    def record(step: Step) -> Step:
        with lock:
            report.steps.append(step)
            if out is not None:
                out.write_text(markdown(report, emulate))
        return step

    if wheels is not None:
        record(timed(f"install {', '.join(WHEELS)} from {wheels}", lambda: install_wheels(wheels)))
    for name in labs:  # quick steps first: a time limit then cuts only the notebooks
        record(timed(f"lab {name}: reference solution", lambda name=name: check_lab(name)))
    with ThreadPoolExecutor(3) as pool:  # each grading is a 4-rank run: three at once on a GPU machine's cores
        list(pool.map(lambda n: record(timed(f"grader: tests/submissions/{n}.py", lambda: grade_submission(n))),
                      graded))
    record(timed("benchmarks/gpu_check.py: measured vs modelled", lambda: measure(emulate, report)))
    two_gpu_steps(emulate, record, failure_log)
    notebook_steps(notebooks, 1 if emulate else 4, record, failure_log)
    return report


def markdown(report: Report, emulate: bool) -> str:
    """The results file: environment, steps, ratios."""
    lines = [f"# Course check on {report.environment['GPUs']} ({datetime.date.today().isoformat()})", ""]
    if emulate:
        lines += ["**CPU dry run (`--emulate`)**: a subset, on CPU processes. Nothing here was measured on a GPU.", ""]
    lines += ["| | |", "|---|---|"]
    lines += [f"| {key} | {value.splitlines()[0] if key == 'course info' else value} |"
              for key, value in report.environment.items()]
    lines += ["", "```", report.environment["course info"], "```", "",
              f"## Steps: {'all passed' if report.passed else 'SOME FAILED'}", "",
              "| step | result | seconds | detail |", "|---|---|---|---|"]
    for step in report.steps:
        verdict = {True: "pass", False: "**FAIL**", None: "skipped"}[step.passed]
        lines.append(f"| {step.name} | {verdict} | {step.seconds:.0f} | {step.detail.replace('|', '/')} |")
    lines += ["", "## Measured vs modelled (`course.perf`)", ""]
    if report.ratios:
        lines += ["| what | measured | modelled | measured / modelled |", "|---|---|---|---|"]
        for row in report.ratios:
            modelled = f"{row['modelled']:.3f} {row['unit']}" if row["modelled"] is not None else "not modelled"
            ratio = gpu_check.ratio(row)
            lines.append(f"| {row['what']} | {row['measured']:.3f} {row['unit']} | {modelled} | "
                         f"{f'{ratio:.2f}' if ratio is not None else '-'} |")
    else:
        lines.append("Nothing measured.")
    return "\n".join(lines) + "\n"


def default_out() -> Path:
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    slug = re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-")
    return ROOT / "benchmarks" / "results" / f"gpu-check-{slug}-{datetime.date.today().isoformat()}.md"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheels", type=Path, help="a folder of wheels to install nbval, ipykernel, ipywidgets from")
    parser.add_argument("--out", type=Path, help="the markdown results file (default: under benchmarks/results/)")
    parser.add_argument("--emulate", action="store_true", help="the CPU dry run: a small subset, quick")
    parser.add_argument("--skip", action="append", choices=("labs", "grading", "notebooks"), default=[],
                        help="leave out these steps (repeatable): the test suite runs them on its own")
    args = parser.parse_args(argv)
    from grader.labs import registry

    if args.emulate:  # one lab and one broken script: the code paths, in a minute
        notebooks, labs, graded = [ROOT / "notebooks" / "05c_performance_model.ipynb"], ["tp_mlp"], ["unscaled_lr"]
        os.environ[world.EMULATE_ENV] = "1"
    else:
        notebooks, labs, graded = sorted((ROOT / "notebooks").glob("*.ipynb")), sorted(registry.LABS), list(GRADED)
    notebooks, labs, graded = ([] if "notebooks" in args.skip else notebooks, [] if "labs" in args.skip else labs,
                               [] if "grading" in args.skip else graded)
    out = args.out or default_out()
    out.parent.mkdir(parents=True, exist_ok=True)
    report = check(args.emulate, args.wheels, notebooks, labs, graded, out)  # writes ``out`` after each step
    print(f"gpu-check: {'all passed' if report.passed else 'SOME STEPS FAILED'}; results in {out}")
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
