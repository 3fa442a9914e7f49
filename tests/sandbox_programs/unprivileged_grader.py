"""Uses grader.sandbox as an unprivileged user would (a student's laptop): the non-root modes.

tests/test_sandbox.py runs this inside the root sandbox, so it runs as a sandbox uid; it sandboxes hostile
programs in turn, with the isolation given as argv[1], and prints one JSON line per program: its status,
output, mechanisms, and the processes it left (there must be none).
"""
import json
import os
import sys
import tempfile
from pathlib import Path

import psutil

from grader.sandbox import Limits, run

here = Path(__file__).parent
cases = {
    "fork_bomb.py": Limits(max_processes=8, max_threads=24, wall_s=5),
    "setsid_escapee.py": Limits(wall_s=10),
    # long enough for the sandbox to start and report its containment on a loaded machine, before the loop is timed out
    "infinite_loop.py": Limits(wall_s=5),
    "network_probe.py": Limits(wall_s=10),
}
for name, limits in cases.items():
    program = str(here / name)
    with tempfile.TemporaryDirectory(dir=".") as cwd:
        result = run([sys.executable, program], cwd=Path(cwd), env=dict(os.environ), limits=limits,
                     isolation=sys.argv[1])
    left = [p.pid for p in psutil.process_iter(["cmdline", "status"])
            if p.info["status"] != psutil.STATUS_ZOMBIE and program in (p.info["cmdline"] or [])]
    report = {"program": name, "uid": os.getuid(), "status": result.status, "stdout": result.stdout,
              "stderr": result.stderr[-600:], "detail": result.detail, "mechanisms": result.mechanisms, "left": left}
    print(json.dumps(report), flush=True)
