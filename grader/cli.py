"""``grader``: the course's autograder, a thin layer over :mod:`grader.grading` (one submission: the assignment
and its labs), :mod:`grader.gradebook` and :mod:`grader.render`.

    grader check train_4gpu.py               the student's self-check: the visible checks, with feedback
    grader check ring ring_allreduce.py      a lab's self-check (grader.labs): its visible checks, with feedback
    grader grade SUBMISSIONS_DIR -o OUT      an instructor grades a class (CSV, Gradescope JSON, feedback)
    grader render OUT [--submissions DIR]    re-render OUT's gradebook from its saved raw results
    grader gradescope                        inside Gradescope: /autograder/submission -> results.json

Taught in ``notebooks/06_assignment.ipynb``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import CancelledError, ThreadPoolExecutor, as_completed
from dataclasses import replace
from pathlib import Path

from grader import labs, render
from grader.gradebook import graded_before, output_keys, rebuild, save, scan, submissions_in
from grader.grading import grade_submission
from grader.results import Results
from grader.runner import GRADER_STOPPED, GradingConfig, not_run
from grader.submission import submitter_ids

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


@contextlib.contextmanager
def stopping_on_signals(config: GradingConfig | None) -> Iterator[GradingConfig]:
    """``config`` with a ``stop`` event that SIGTERM, SIGHUP or SIGINT sets while the block runs (main thread only).

    The runs in progress then end at once with status ``interrupted``, keeping what the ranks printed, and
    are saved as such (``--resume`` grades them again); a second signal acts as it would without this.
    """
    config = config or GradingConfig()
    if config.stop is not None or threading.current_thread() is not threading.main_thread():
        yield config
        return
    stop = threading.Event()
    previous = {}

    def handle(signum, frame):
        stop.signum = signum  # for the exit code, 128 + signum, as if the signal had ended the process
        stop.set()
        for number, handler in previous.items():  # the next signal is handled as before
            signal.signal(number, handler)

    for number in STOP_SIGNALS:
        previous[number] = signal.signal(number, handle)
    try:
        yield replace(config, stop=stop)
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def check(path: Path, config: GradingConfig | None = None) -> Results:
    """The self-check: grade ``path`` on the visible checks and print the feedback. Usable from a notebook."""
    with stopping_on_signals(config) as config:
        results = grade_submission(Path(path), replace(config, visible_only=True)) or not_run(
            Path(path).name, GRADER_STOPPED, "the grader was stopped before it started")
    print(render.feedback(results, visible_only=True), end="")
    return results


DEFAULT_JOBS = min(2, os.cpu_count() or 1)  # two 4-rank runs at a time fill a 2-core machine (docs/instructors.md)


def check_lab(lab: str, path: Path) -> bool:
    """A lab's self-check: its visible checks on ``path``, its feedback printed; True if every check passed."""
    return labs.check(lab, str(path)).passed


def grade_class(folder: Path, out: Path, jobs: int = 2, config: GradingConfig | None = None,
                progress: bool = True, resume: bool = False) -> list[Results]:
    """Grade every submission in ``folder``, ``jobs`` at a time; save each result as it completes.

    The gradebook ``out/gradebook.csv`` is rewritten after every submission and always lists exactly the
    submissions now in ``folder``, so an interrupted batch loses nothing already graded. ``resume=True``
    skips submissions already graded cleanly in ``out`` (a ``grader error`` or an ``interrupted`` run is graded
    again). A stop signal (see :func:`stopping_on_signals`) ends the runs in progress as ``interrupted`` and
    starts no other; those are then missing from the returned list.

    Returns:
        one Results per submission graded, in the order of :func:`submissions_in`.

    Raises:
        FileNotFoundError, ValueError: see :func:`scan` and :func:`output_keys`.
    """
    from tqdm import tqdm

    with stopping_on_signals(config) as config:
        return _grade_all(folder, Path(out), jobs, config, progress, resume, tqdm)


def _grade_all(folder: Path, out: Path, jobs: int, config: GradingConfig, progress: bool, resume: bool,
               tqdm) -> list[Results]:
    submissions = submissions_in(folder, out)
    keys = output_keys(submissions)
    graded = graded_before(out, keys) if resume else {}
    for name, results in graded.items():
        save(results, out, keys[name])  # under its current name, which a new submission may have changed
    todo = [p for p in submissions if p.name not in graded]
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool, \
            tqdm(total=len(todo), desc="grading", unit="submission", disable=not progress) as bar:
        futures = [pool.submit(grade_submission, path, config, submitter_ids(path)) for path in todo]
        for future in as_completed(futures):
            if config.stop is not None and config.stop.is_set():
                for waiting in futures:  # not started yet: left ungraded (--resume grades them)
                    waiting.cancel()
            try:
                results = future.result()
            except CancelledError:
                continue
            if results is None:
                continue
            save(results, out, keys[results.submission])
            graded[results.submission] = results
            render.write_gradebook(list(graded.values()), out / "gradebook.csv")
            bar.set_postfix_str(f"{results.submission}: {results.grade_status}")
            bar.update()
    render.write_gradebook(list(graded.values()), out / "gradebook.csv")
    return [graded[p.name] for p in submissions if p.name in graded]


def run_autograder(submission: Path = Path("/autograder/submission"),
                   results_path: Path = Path("/autograder/results/results.json"),
                   config: GradingConfig | None = None) -> Results:
    """Gradescope's entry: grade the submission folder, write ``results.json`` there; always writes it.

    The labs are checked on the submitter's variant, named in ``submission_metadata.json`` beside the folder."""
    who = submitter_ids(Path(submission), Path(submission).parent / "submission_metadata.json")
    with stopping_on_signals(config) as config:
        results = grade_submission(Path(submission), config, who) or not_run(Path(submission).name, GRADER_STOPPED,
                                                                         "the grader was stopped before it started")
    render.write_gradescope(results, Path(results_path))
    return results


def _labs_epilog() -> str:
    """Every lab, for ``grader --help``: its name, what the student writes and the ``grader check`` line."""
    from grader.labs.registry import LABS

    lines = {f"grader check {name} {lab.student_file}": f"{lab.title} (notebook {lab.notebook})"
             for name, lab in LABS.items()}
    width = max(map(len, lines))
    return "labs (from notebooks/):\n" + "\n".join(f"  {command:<{width}}  {what}" for command, what in lines.items())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="grader", description=__doc__.split("\n")[0], epilog=_labs_epilog(),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p_check = sub.add_parser("check", help="self-check one script (or, given a lab's name first, a lab file) on the "
                                           "visible checks")
    p_check.add_argument("file", type=Path, nargs="+", metavar="[LAB] FILE",
                         help="the assignment's script, or a lab's name (e.g. ring) and your file for it")
    p_grade = sub.add_parser("grade", help="grade a folder of submissions")
    p_grade.add_argument("submissions", type=Path)
    p_grade.add_argument("-o", "--out", type=Path, default=Path("grading_out"))
    p_grade.add_argument("-j", "--jobs", type=int, default=DEFAULT_JOBS,
                         help=f"submissions graded at once, each running 4 ranks (default: min(2, CPUs) = "
                              f"{DEFAULT_JOBS}; more only helps with more than 2 cores and memory to match)")
    p_grade.add_argument("--resume", action="store_true",
                         help="skip submissions already graded cleanly in OUT (grader errors and interrupted runs are "
                              "graded again)")
    p_render = sub.add_parser("render", help="re-render OUT/gradebook.csv from OUT/results/*.json, for the "
                                             "submissions it lists (or those in --submissions)")
    p_render.add_argument("out", type=Path)
    p_render.add_argument("--submissions", type=Path, default=None,
                          help="the submissions folder: list exactly the submissions now in it")
    p_gs = sub.add_parser("gradescope", help="Gradescope's run_autograder entry")
    p_gs.add_argument("--submission", type=Path, default=Path("/autograder/submission"))
    p_gs.add_argument("--results", type=Path, default=Path("/autograder/results/results.json"))
    args = parser.parse_args(argv)
    if args.command == "check":
        if len(args.file) == 2:
            try:
                return 0 if check_lab(str(args.file[0]), args.file[1]) else 1
            except ValueError as error:  # no such lab
                print(f"grader: {error}", file=sys.stderr)
                return 2
        if len(args.file) > 2:
            parser.error("check takes FILE, or LAB FILE")
        results = check(args.file[0])
        return 0 if all(c.passed for c in results.checks) and all(lab.passed for lab in results.labs.values()) else 1
    if args.command == "grade":
        try:
            for note in scan(args.submissions, args.out)[1]:
                print(f"grader: skipped {note}", file=sys.stderr)
            with stopping_on_signals(None) as config:
                all_results = grade_class(args.submissions, args.out, args.jobs, config, resume=args.resume)
        except (FileNotFoundError, ValueError) as error:
            print(f"grader: {error}", file=sys.stderr)
            return 2
        print(f"graded {len(all_results)} submission(s): {args.out / 'gradebook.csv'}")
        if config.stop.is_set():
            stopped = sum(r.status == GRADER_STOPPED for r in all_results)
            print(f"grader: stopped by a signal; {stopped} run(s) were interrupted and the rest not started: "
                  f"`grader grade {args.submissions} -o {args.out} --resume` grades them", file=sys.stderr)
            return 128 + getattr(config.stop, "signum", signal.SIGTERM)
        return 0
    if args.command == "render":
        try:
            all_results, notes = rebuild(args.out, args.submissions)
        except (FileNotFoundError, ValueError) as error:
            print(f"grader: {error}", file=sys.stderr)
            return 2
        for note in notes:
            print(f"grader: {note}", file=sys.stderr)
        print(f"{len(all_results)} result(s) -> {args.out / 'gradebook.csv'}")
        return 0
    results = run_autograder(args.submission, args.results)
    print(render.feedback(results), end="")
    return 0
