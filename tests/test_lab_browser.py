"""The student's path in a real browser: JupyterLab started by `course lab`'s own code, driven in headless Chromium.

Run All on a notebook with the live monitor (the panel must change while the cell is busy, then leave its static
summary, with no error output), and a Lab terminal that runs the course's commands. Needs Debian's `chromium`
(`.ci/run` installs it; `apt-get install chromium` elsewhere) and Playwright for Python, which drives it through
``executable_path`` (no browser download). A screenshot of each stage lands in ``test-artifacts/``.
"""

from __future__ import annotations

import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

from course import cli
from course.runtime.ports import reserved_port

pytestmark = [pytest.mark.unit6, pytest.mark.slow, pytest.mark.timeout(240)]

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
TOKEN = "course-test"
# As root in a container Chromium needs --no-sandbox; the rest keeps it off a network it cannot reach.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-sync",
                 "--disable-background-networking", "--disable-component-update"]
# Two ranks, each busy half of every tenth of a second for 8 s: the monitor has load to show, at a quarter of the
# CPU that four ranks spinning flat out would take from the tests running beside this one.
SPIN = ("import time\nend = time.monotonic() + 8\nwhile time.monotonic() < end:\n"
        "    busy = time.monotonic() + 0.05\n    while time.monotonic() < busy:\n        pass\n    time.sleep(0.05)\n")
# A student's train_4gpu.py that prints, then fails on rank 2 (the typo of a DDP script run without DDP).
BROKEN_ASSIGNMENT = """from course import models, world

rank = world.init_from_env()
print(f"rank {rank.rank} joined", flush=True)
model = models.DigitsCNN()
if rank.rank == 2:
    model.module.state_dict()
world.shutdown()
"""


@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None:
        pytest.skip("Debian's chromium is not installed: `apt-get install chromium` (.ci/run does)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the test extra)")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """`course lab` (its command and environment) on a free port, rooted at a scratch folder with one notebook."""
    root = tmp_path_factory.mktemp("lab")
    (root / "spin.py").write_text(SPIN)
    notebook = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("import sys\nfrom course.monitor import watch as monitor"),
        nbformat.v4.new_code_cell(
            'run = monitor.run_and_watch([sys.executable, "-m", "torch.distributed.run", "--standalone",\n'
            '                             "--nproc_per_node=2", "spin.py"], timeout_s=120)\n'
            'print("exit code", run.returncode)'),
    ], metadata={"kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}})
    nbformat.write(notebook, root / "monitor_demo.ipynb")
    shutil.copy(cli.notebooks_dir() / "06_assignment.ipynb", root)  # the assignment, with a script already written
    shutil.copytree(cli.notebooks_dir() / "assignment", root / "assignment")
    (root / "runs").mkdir()
    (root / "runs" / "train_4gpu.py").write_text(BROKEN_ASSIGNMENT)
    with reserved_port() as port:  # held for the server, which binds it too
        env = {**cli.lab_environment(), "JUPYTER_RUNTIME_DIR": str(root / ".runtime"),
               "JUPYTER_CONFIG_DIR": str(root / ".config"), "JUPYTERLAB_WORKSPACES_DIR": str(root / ".workspaces")}
        command = cli.lab_command(["--no-browser", f"--port={port}", f"--IdentityProvider.token={TOKEN}"], root=root)
        server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                                  cwd=cli.notebooks_dir())
        try:
            for _ in range(120):
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status?token={TOKEN}", timeout=5)
                    break
                except OSError:
                    time.sleep(1)
            else:
                pytest.fail(f"JupyterLab did not answer within two minutes: {command}")
            yield f"http://127.0.0.1:{port}", root
        finally:
            server.terminate()
            server.wait(timeout=30)


def _screenshot(page, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def test_run_all_shows_the_monitor_changing_while_the_cell_is_busy_then_its_summary(browser, lab):
    url, _ = lab
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(f"{url}/lab/tree/monitor_demo.ipynb?token={TOKEN}")
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
    page.get_by_text("Python 3 (ipykernel) | Idle").wait_for(timeout=60_000)  # the status bar: kernel ready
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.get_by_text("Run All Cells", exact=True).click()
    output = page.locator(".jp-Cell").nth(1).locator(".jp-OutputArea")
    prompt = page.locator(".jp-Cell").nth(1).locator(".jp-InputPrompt")
    seen, deadline = [], time.monotonic() + 120
    while time.monotonic() < deadline:
        busy = "*" in prompt.inner_text()
        panel = output.inner_text() if output.count() else ""
        if busy and panel and (not seen or seen[-1] != panel):
            seen.append(panel)
            if len(seen) == 3:
                _screenshot(page, "lab-monitor-live")
        if not busy and "exit code" in panel:
            break
        time.sleep(0.3)
    _screenshot(page, "lab-monitor-finished")
    final = output.inner_text()
    assert len(seen) >= 3, f"the live panel changed {len(seen)} time(s) while the cell ran: {seen}"
    assert "finished after" in final and "exit code 0" in final, final
    assert "Traceback" not in final
    assert page.locator("[data-mime-type='application/vnd.jupyter.error']").count() == 0, final
    assert "Error displaying widget" not in page.content()
    page.get_by_role("menuitem", name="File", exact=True).click()  # save, then reopen: the summary stays
    page.locator(".lm-Menu-item:has(.lm-Menu-itemLabel:text-is('Save Notebook'))").click()
    page.get_by_text("Saving completed").wait_for(timeout=30_000)
    page.reload()
    page.get_by_text("exit code 0").wait_for(timeout=60_000)
    reopened = page.locator(".jp-Cell").nth(1).locator(".jp-OutputArea").inner_text()
    _screenshot(page, "lab-monitor-reopened")
    assert "finished after" in reopened and "Error displaying widget" not in page.content(), reopened
    page.close()


def test_a_lab_terminal_runs_the_courses_commands(browser, lab, tmp_path):
    url, _ = lab
    page = browser.new_page(viewport={"width": 1200, "height": 800})
    page.goto(f"{url}/lab?token={TOKEN}")
    page.wait_for_selector("#jp-MainMenu", timeout=60_000)
    page.get_by_role("menuitem", name="File", exact=True).click()  # File > New > Terminal
    page.locator(".lm-Menu-item:has(.lm-Menu-itemLabel:text-is('New'))").hover()
    page.locator(".lm-Menu-item:has(.lm-Menu-itemLabel:text-is('Terminal'))").click()
    try:
        page.wait_for_selector(".jp-Terminal .xterm", timeout=60_000)
    finally:
        _screenshot(page, "lab-terminal")
    page.locator(".jp-Terminal .xterm").click()
    out = tmp_path / "out"
    page.keyboard.type(f"mkdir -p {out} && pwd > {out}/pwd && grader --help > {out}/grader && "
                       f"torchrun --help > {out}/torchrun; echo $? > {out}/done\n")
    deadline = time.monotonic() + 60
    while not (out / "done").exists() and time.monotonic() < deadline:
        time.sleep(0.3)
    _screenshot(page, "lab-terminal")
    page.close()
    assert (out / "done").read_text().strip() == "0"
    assert (out / "pwd").read_text().strip() == str(cli.notebooks_dir())
    assert "usage: grader" in (out / "grader").read_text()
    assert "usage: torchrun" in (out / "torchrun").read_text()


def test_the_assignment_run_shows_the_failing_ranks_traceback_and_the_self_check_says_why(browser, lab):
    url, _ = lab
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(f"{url}/lab/tree/06_assignment.ipynb?token={TOKEN}")
    page.get_by_text("Python 3 (ipykernel) | Idle").wait_for(timeout=60_000)
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.get_by_text("Run All Cells", exact=True).click()
    page.locator(".jp-OutputArea-output", has_text="/ 100 points").wait_for(state="attached", timeout=180_000)
    _screenshot(page, "lab-assignment")
    # the notebook in view (the Lab may have restored other notebooks' tabs); off-screen cells too
    outputs = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea").all_text_contents()
    page.close()
    run = next(text for text in outputs if "exit code" in text)
    assert "rank 2 failed first" in run and "has no attribute 'module'" in run, run
    assert "rank 0 joined" in run  # what the script printed, and then its traceback
    check = next(text for text in outputs if "/ 100 points" in text)
    assert "status: crash on rank 2" in check, check
