"""``grader``: the assignment's autograder, a thin layer over :mod:`grader.runner` and :mod:`grader.reports`.

    grader check train_4gpu.py               the student's self-check: the visible checks, with feedback
    grader grade SUBMISSIONS_DIR -o OUT      an instructor grades a class (CSV, Gradescope JSON, feedback)
    grader report OUT                        re-render OUT's gradebook from its saved raw results
    grader gradescope                        inside Gradescope: /autograder/submission -> results.json

Taught in ``notebooks/06_assignment.ipynb``.
"""

from __future__ import annotations

import argparse
import os
import sys
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import replace
from pathlib import Path

from grader import reports
from grader.results import Results
from grader.runner import GradingConfig, grade


def check(path: Path, config: GradingConfig | None = None) -> Results:
    """The self-check: grade ``path`` on the visible checks and print the feedback. Usable from a notebook."""
    results = grade(Path(path), replace(config or GradingConfig(), visible_only=True))
    print(reports.feedback(results, visible_only=True), end="")
    return results


def submissions_in(folder: Path) -> list[Path]:
    """Each entry of ``folder`` (a file or a folder per student), hidden entries skipped, sorted by name."""
    if not Path(folder).is_dir():
        raise FileNotFoundError(f"{folder} is not a folder of submissions (one file or folder per student).")
    return sorted(p for p in Path(folder).iterdir() if not p.name.startswith((".", "_")))


def _grade_safely(path: Path, config: GradingConfig) -> Results:
    try:
        return grade(path, config)
    except Exception as error:  # noqa: BLE001  (one submission must never stop the batch)
        return Results(path.name, "grader error", f"{type(error).__name__}: {error}")


def save(results: Results, out: Path) -> None:
    """Write one submission's raw results, Gradescope JSON and feedback under ``out``."""
    stem = results.submission.removesuffix(".py")
    for folder in ("results", "feedback", "gradescope"):
        (out / folder).mkdir(parents=True, exist_ok=True)
    results.save(out / "results" / f"{stem}.json")
    reports.write_gradescope(results, out / "gradescope" / stem / "results.json")
    (out / "feedback" / f"{stem}.txt").write_text(reports.feedback(results))


def grade_class(folder: Path, out: Path, jobs: int = 2, config: GradingConfig | None = None,
                progress: bool = True, resume: bool = False) -> list[Results]:
    """Grade every submission in ``folder``, ``jobs`` at a time; save each result as it completes.

    The gradebook ``out/gradebook.csv`` is rewritten after every submission, so an interrupted batch loses
    nothing already graded; ``resume=True`` skips submissions whose raw results already exist.
    """
    from tqdm import tqdm

    out = Path(out)
    done = {p.stem: Results.load(p) for p in sorted((out / "results").glob("*.json"))} if resume else {}
    todo = [p for p in submissions_in(folder) if p.name.removesuffix(".py") not in done]
    all_results = list(done.values())
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool, \
            tqdm(total=len(todo), desc="grading", unit="submission", disable=not progress) as bar:
        futures = {pool.submit(_grade_safely, path, config or GradingConfig()): path for path in todo}
        for future in as_completed(futures):
            results = future.result()
            save(results, out)
            all_results.append(results)
            reports.write_gradebook(all_results, out / "gradebook.csv")
            bar.set_postfix_str(f"{results.submission}: {results.status}")
            bar.update()
    reports.write_gradebook(all_results, out / "gradebook.csv")
    return all_results


def run_autograder(submission: Path = Path("/autograder/submission"),
                   results_path: Path = Path("/autograder/results/results.json"),
                   config: GradingConfig | None = None) -> Results:
    """Gradescope's entry: grade the submission folder, write ``results.json`` there; always writes it."""
    results = _grade_safely(Path(submission), config or GradingConfig())
    reports.write_gradescope(results, Path(results_path))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="grader", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_check = sub.add_parser("check", help="self-check one script on the visible checks")
    p_check.add_argument("file", type=Path)
    p_grade = sub.add_parser("grade", help="grade a folder of submissions")
    p_grade.add_argument("submissions", type=Path)
    p_grade.add_argument("-o", "--out", type=Path, default=Path("grading_out"))
    p_grade.add_argument("-j", "--jobs", type=int, default=max(1, min(2, (os.cpu_count() or 1) // 2 or 1)))
    p_grade.add_argument("--resume", action="store_true", help="skip submissions already graded in OUT")
    p_report = sub.add_parser("report", help="re-render OUT/gradebook.csv from OUT/results/*.json")
    p_report.add_argument("out", type=Path)
    p_gs = sub.add_parser("gradescope", help="Gradescope's run_autograder entry")
    p_gs.add_argument("--submission", type=Path, default=Path("/autograder/submission"))
    p_gs.add_argument("--results", type=Path, default=Path("/autograder/results/results.json"))
    args = parser.parse_args(argv)
    if args.command == "check":
        results = check(args.file)
        return 0 if all(c.passed for c in results.checks) else 1
    if args.command == "grade":
        try:
            all_results = grade_class(args.submissions, args.out, args.jobs, resume=args.resume)
        except FileNotFoundError as error:
            print(f"grader: {error}", file=sys.stderr)
            return 2
        print(f"graded {len(all_results)} submission(s): {args.out / 'gradebook.csv'}")
        return 0
    if args.command == "report":
        all_results = [Results.load(p) for p in sorted((args.out / "results").glob("*.json"))]
        reports.write_gradebook(all_results, args.out / "gradebook.csv")
        print(f"{len(all_results)} result(s) -> {args.out / 'gradebook.csv'}")
        return 0
    results = run_autograder(args.submission, args.results)
    print(reports.feedback(results), end="")
    return 0
