"""What one graded submission needs of its container: peak memory of all its processes together, CPU, wall time.

    python benchmarks/autograder_footprint.py [SCRIPT]   (default: the reference solution)

Grades SCRIPT once, as Gradescope's ``run_autograder`` does (one submission, the grader's default configuration),
while a thread samples this process's whole tree every 0.2 s with psutil: the grader, the sandboxed
launcher and its 4 ranks, the evaluation process, DataLoader workers. It prints the peak of their summed
proportional memory (PSS: a page shared by n processes counts 1/n to each, so forked ranks' shared torch is
counted once, as a container's memory limit counts it), the peak of their summed resident memory (RSS, which
counts shared pages once per process), the most processes at once, the CPU seconds used by the tree, the wall
time and their ratio (the cores it kept busy on average). Gradescope's default container is about half a CPU and
768 MB (docs/instructors.md says what the package needs and why).

Every number is measured on this machine, under whatever else runs on it; the load average is printed with them.
"""

from __future__ import annotations

import os
import resource
import sys
import threading
import time
from pathlib import Path

import psutil

from course.runtime import pace
from grader.runner import GradingConfig, grade

ROOT = Path(__file__).resolve().parent.parent
MIB = 2**20


class TreeSampler(threading.Thread):
    """Samples this process and all its descendants until stopped; keeps the peaks."""

    def __init__(self, period_s: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.period_s, self.done = period_s, threading.Event()
        self.peak_pss = self.peak_rss = self.peak_processes = 0
        self.at_peak: list[tuple[str, int]] = []
        self.cpu_s: dict[tuple[int, float], float] = {}  # (pid, start time) -> its own CPU seconds, last seen

    def run(self) -> None:
        me = psutil.Process()
        while not self.done.is_set():
            pss = rss = 0
            seen = []
            for proc in [me, *me.children(recursive=True)]:
                try:
                    info = proc.memory_full_info()
                    times = proc.cpu_times()
                    self.cpu_s[(proc.pid, proc.create_time())] = times.user + times.system
                    pss += info.pss
                    rss += info.rss
                    seen.append((_role(proc, me), info.pss))
                except psutil.Error:
                    continue
            if pss > self.peak_pss:
                self.peak_pss, self.at_peak = pss, seen
            self.peak_rss = max(self.peak_rss, rss)
            self.peak_processes = max(self.peak_processes, len(seen))
            self.done.wait(self.period_s)


def _role(proc: psutil.Process, me: psutil.Process) -> str:
    """What a process of the grading is, in a few words."""
    if proc.pid == me.pid:
        return "the grader (this process: torch and the course data loaded)"
    command = " ".join(proc.cmdline())
    if '"limits"' in command or "bwrap" in command:  # its argument, a JSON config, names what it supervises
        return "a sandbox supervisor"
    if "grader.inrank.launcher" in command:
        parent = proc.parent()
        above = " ".join(parent.cmdline()) if parent is not None else ""
        is_rank = "grader.inrank.launcher" in above and '"limits"' not in above
        return "a rank (a fork of the launcher)" if is_rank else "the launcher (torch preloaded; the ranks' parent)"
    if "grader.evaluate" in command:
        return "the checkpoint's evaluation process"
    return command[:60]


def main(argv: list[str]) -> int:
    script = Path(argv[0]) if argv else ROOT / "tests" / "submissions" / "reference.py"
    machine = pace.machine_pace()
    sampler = TreeSampler()
    before = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    sampler.start()
    start = time.perf_counter()
    results = grade(script, GradingConfig())
    wall_s = time.perf_counter() - start
    sampler.done.set()
    sampler.join()
    after = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    # reaped children's CPU (rusage) misses processes killed at the end of the run and reaped inside the sandbox;
    # the samples miss each process's last 0.2 s: the larger of the two
    reaped = sum((a.ru_utime + a.ru_stime) - (b.ru_utime + b.ru_stime) for a, b in zip(after, before, strict=True))
    cpu_s = max(reaped, sum(sampler.cpu_s.values()) - (before[0].ru_utime + before[0].ru_stime))
    print(f"submission: {script.name}: {results.status}, {results.score:g} / {results.max_score:g}")
    print(f"machine: {psutil.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}, pace {machine.factor:.1f}x")
    print(f"wall time: {wall_s:.1f} s")
    print(f"CPU time (grader + every process it started): {cpu_s:.1f} s, {cpu_s / wall_s:.2f} cores on average")
    print(f"peak memory, all processes together: PSS {sampler.peak_pss / MIB:.0f} MiB, "
          f"RSS {sampler.peak_rss / MIB:.0f} MiB; at most {sampler.peak_processes} processes")
    print("PSS per process at the peak:")
    for command, pss in sorted(sampler.at_peak, key=lambda item: -item[1]):
        print(f"  {pss / MIB:6.0f} MiB  {command}")
    return 0 if results.status == "ok" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
