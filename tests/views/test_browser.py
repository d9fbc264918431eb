"""End to end in a real browser: JupyterLab runs a notebook that launches 4 workers and shows the panel.

JupyterLab is started as a subprocess on a free port with a random token; headless Chromium
(Debian's, driven by Playwright, never downloaded) opens a notebook written into a temporary
directory, runs all of its cells from the Run menu and then reads the live panel from the
page: four rank rows, the RUNNING state, a plot that is redrawn while training runs, and the
Stop button that ends the run while the next cell blocks the kernel in ``run.wait()`` (the
widget gives way to the record of the final state, STOPPED, and the waiting cell prints its
result, then the cell queued behind it runs). It runs twice: with JupyterLab's comms over
subshells (the click handled on a subshell) and without (the click reaches the busy main
shell, as from classic Notebook or VS Code, and ``wait()`` handles it). A screenshot of the
page is kept in ``test-artifacts/panel.png``. The kernel is shut down through the Jupyter
REST API and JupyterLab is terminated before the test ends, so that no process carrying the
test's tag outlives it.

A second test executes a notebook with nbclient (``jupyter execute``), as a notebook is run
and saved, then opens it in a fresh JupyterLab without running it: each panel's output shows
the picture and the table of its run's final state, trusted (as JupyterLab saves a notebook
it ran: signed, no widget state) or not (as nbclient leaves it).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbformat.sign import NotebookNotary

from conftest import ROOT, TESTS, until_value

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = ROOT / "test-artifacts"
NOTEBOOK = "panel_browser.ipynb"
# Notebook 7.6 sends widget messages on subshells by default, as JupyterLab 4.6 does
NOTEBOOK7_SUBSHELLS = True

pytestmark = [
    pytest.mark.browser,
    # CI installs Chromium (.ci/run), so there a missing browser fails instead of skipping.
    pytest.mark.skipif(
        not CHROMIUM.exists() and not os.environ.get("CI"),
        reason=f"Chromium not found at {CHROMIUM}: install Debian's chromium package to run the browser test",
    ),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _code_cell(n: int, source: str) -> dict[str, Any]:
    return {
        "cell_type": "code",
        "execution_count": None,
        "id": f"cell-{n}",
        "metadata": {},
        "outputs": [],
        "source": source,
    }


def write_cells(path: Path, cells: list[dict[str, Any]]) -> None:
    """A notebook of ``cells`` for the python3 kernel."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.from_dict(c) for c in cells])
    nb.metadata = {
        "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    }
    nbformat.write(nb, path)


def write_notebook(path: Path, run_root: Path) -> None:
    """The notebook under test: launch 4 workers on a long run, then show its panel."""
    cells = [
        _code_cell(1, f"import sys\nsys.path.insert(0, {str(TESTS)!r})\nimport orch"),
        _code_cell(
            2,
            'run = orch.launch("jobs:allreduce_steps", world_size=4,\n'
            '                  config={"steps": 100000, "sleep": 0.05},\n'
            f"                  run_root={str(run_root)!r})",
        ),
        _code_cell(3, "run.panel(interval=0.3)"),
        # The next cell blocks the kernel in wait(): Stop must work all the same.
        _code_cell(4, 'result = run.wait()\nprint("WAITED", result.state.value)'),
        # Queued behind it by Run All: it runs after, and says whether the page used subshells.
        _code_cell(
            5,
            'print("NEXT", run.state().state.value, "subshells",\n'
            "      len(get_ipython().kernel.shell_channel_thread.manager.list_subshell()))",
        ),
    ]
    nb = {
        "cells": cells,
        "metadata": {
            "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
            "language_info": {"name": "python"},
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    path.write_text(json.dumps(nb, indent=1))


class Lab:
    """A JupyterLab server in a subprocess, and the bits of its REST API the test needs.
    ``subshells=False``: the page sends widget messages to the kernel's main shell, as
    classic Notebook and VS Code do (the setting "Kernel Comms over subshells": disabled).
    ``app="notebook"``: Jupyter Notebook 7 instead, built from JupyterLab's parts."""

    def __init__(self, root: Path, home: Path, subshells: bool = True, app: str = "lab") -> None:
        self.app = app
        self.port = _free_port()
        self.token = secrets.token_hex(16)
        self.base = f"http://127.0.0.1:{self.port}"
        settings = home / "user-settings"
        # no news, no update check: nothing in the page or the server reaches the network
        notification = settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
        notification.parent.mkdir(parents=True)
        notification.write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))
        if not subshells:
            kernels = notification.parent / "kernels-settings.jupyterlab-settings"
            kernels.write_text(json.dumps({"commsOverSubshells": "disabled"}))
        env = dict(os.environ)  # carries ORCH_TEST_TAG to the server, its kernels and the workers
        env["PYTHONPATH"] = os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        env["JUPYTER_RUNTIME_DIR"] = str(home / "runtime")
        env["JUPYTER_CONFIG_DIR"] = str(home / "config")
        env["JUPYTER_DATA_DIR"] = str(home / "data")  # its notebook-signing key: what it trusts
        env["JUPYTERLAB_WORKSPACES_DIR"] = str(home / "workspaces")
        env["JUPYTERLAB_SETTINGS_DIR"] = str(settings)
        env["PYTHONUNBUFFERED"] = "1"
        self.log_path = home / "jupyterlab.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "jupyter",
                app,
                "--no-browser",
                f"--ServerApp.port={self.port}",
                "--ServerApp.port_retries=0",
                f"--IdentityProvider.token={self.token}",
                f"--ServerApp.root_dir={root}",
                "--ServerApp.ip=127.0.0.1",
                *(
                    [
                        "--LabApp.news_url=None",
                        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
                        "--LabApp.extension_manager=readonly",
                        f"--LabApp.user_settings_dir={settings}",
                        f"--LabApp.workspaces_dir={home / 'workspaces'}",
                    ]
                    if app == "lab"
                    else [
                        f"--JupyterNotebookApp.user_settings_dir={settings}",
                        f"--JupyterNotebookApp.workspaces_dir={home / 'workspaces'}",
                    ]
                ),
                *(["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []),
            ],
            env=env,
            cwd=root,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def notebook_url(self, name: str) -> str:
        where = "lab/tree" if self.app == "lab" else "notebooks"
        return f"{self.base}/{where}/{name}?token={self.token}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def api(self, method: str, path: str) -> Any:
        req = urllib.request.Request(
            f"{self.base}{path}", method=method, headers={"Authorization": f"token {self.token}"}
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            body = resp.read()
        return json.loads(body) if body else None

    def wait_ready(self, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"JupyterLab exited with {self.proc.returncode}:\n{self.log()}")
            try:
                with urllib.request.urlopen(f"{self.base}/api/status?token={self.token}", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.3)
        raise AssertionError(f"JupyterLab did not answer within {timeout}s:\n{self.log()}")

    def shutdown_kernels(self, timeout: float = 30.0) -> None:
        """DELETE every kernel (the kernel's atexit hook closes the run and its workers)."""
        for kernel in self.api("GET", "/api/kernels"):
            self.api("DELETE", f"/api/kernels/{kernel['id']}")
        deadline = time.monotonic() + timeout
        while self.api("GET", "/api/kernels") and time.monotonic() < deadline:
            time.sleep(0.2)

    def stop(self) -> None:
        try:
            if self.proc.poll() is None:
                with contextlib.suppress(OSError):  # URLError, ConnectionError, TimeoutError
                    self.shutdown_kernels()
                self.proc.terminate()
                try:
                    self.proc.wait(30)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(10)
        finally:
            self._log.close()


@contextlib.contextmanager
def lab_browser(
    tmp_path: Path,
    root: Path,
    home: Path,
    run_root: Path,
    height: int,
    subshells: bool = True,
    width: int = 1280,
    app: str = "lab",
) -> Iterator[tuple[Lab, Any]]:
    """JupyterLab serving ``root`` and a headless Chromium context on it; both gone after.
    On a failure JupyterLab's log and the runs' worker logs are kept (test-artifacts/)."""
    from playwright.sync_api import sync_playwright

    lab = Lab(root, home, subshells, app)
    try:
        lab.wait_ready()
        with (
            sync_playwright() as pw,
            tempfile.TemporaryDirectory(prefix="orch-chromium-", dir=tmp_path) as profile,
        ):
            ctx = pw.chromium.launch_persistent_context(
                profile,
                executable_path=str(CHROMIUM),
                headless=True,
                args=CHROMIUM_ARGS,
                viewport={"width": width, "height": height},
            )
            try:
                yield lab, ctx
            finally:
                ctx.close()
    except BaseException:
        lab.stop()
        keep_failure_logs(lab, run_root)
        raise
    finally:
        lab.stop()


def wait_until(predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    if not predicate():
        raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("app", "subshells"),
    [("lab", True), ("lab", False), ("notebook", NOTEBOOK7_SUBSHELLS)],
    ids=["subshells-on", "subshells-off", "notebook7"],
)
def test_panel_in_jupyterlab(tmp_path: Path, app: str, subshells: bool) -> None:
    """Also with the page's widget messages sent to the kernel's main shell (subshells off,
    as classic Notebook and VS Code send them), and in Jupyter Notebook 7: the controls
    answer and Stop ends the run while a cell waits."""
    from playwright.sync_api import expect

    root = tmp_path / "lab"
    root.mkdir()
    home = tmp_path / "home"
    home.mkdir()
    run_root = tmp_path / "runs"
    write_notebook(root / NOTEBOOK, run_root)
    ARTIFACTS.mkdir(exist_ok=True)
    tail = ("" if subshells else "-no-subshells") if app == "lab" else "-notebook7"
    shot = ARTIFACTS / f"panel{tail}.png"

    with lab_browser(tmp_path, root, home, run_root, 1000, subshells, app=app) as (lab, ctx):
        try:
            page = ctx.pages[0] if ctx.pages else ctx.new_page()
            page.set_default_timeout(60_000)
            page.goto(lab.notebook_url(NOTEBOOK))
            run_all_cells(page, lab)

            panel = page.locator(".orch-panel")
            panel.wait_for(timeout=120_000)
            rows = panel.locator("tr.orch-rank")
            state = panel.locator("span.orch-state")
            stop = panel.locator("button", has_text="Stop")
            plot = panel.locator("img")

            expect(rows).to_have_count(4, timeout=120_000)
            expect(state).to_have_attribute("data-state", "RUNNING", timeout=120_000)
            assert sorted(rows.evaluate_all("rs => rs.map(r => r.dataset.rank)")) == ["0", "1", "2", "3"]
            # the workers have logged points: the plot is drawn
            expect(plot).to_have_attribute("src", re.compile(r"^blob:|^data:"))
            wait_until(lambda: _step(rows) > 5, 60, "rank 0 to make progress")

            # two looks while training runs: the plot was redrawn in between (waited for, not
            # slept on: a loaded 2-core machine keeps no pace)
            src1, png1, step1 = plot.get_attribute("src"), plot.screenshot(), _step(rows)
            wait_until(
                lambda: (
                    _step(rows) > step1 and plot.get_attribute("src") != src1 and plot.screenshot() != png1
                ),
                60,
                "the plot to be redrawn",
            )
            src2, png2, step2 = plot.get_attribute("src"), plot.screenshot(), _step(rows)
            assert state.get_attribute("data-state") == "RUNNING"
            assert step2 > step1, (step1, step2)
            assert src1 != src2, "the plot image was not replaced while training ran"
            assert png1 != png2, "the plot did not change while training ran"
            expect(stop).to_be_enabled()
            page.screenshot(path=str(shot), full_page=True)

            # The kernel is busy in the fourth cell's run.wait(): a click must still stop the run.
            waiting = page.locator(".jp-Notebook .jp-Cell").nth(3)
            expect(waiting.locator(".jp-InputPrompt")).to_have_text("[*]:")  # still running
            assert "WAITED" not in waiting.locator(".jp-Cell-outputWrapper").inner_text()
            # The other controls answer too while the cell waits: the log scale and another
            # metric are drawn at once (the plot's classes say what it draws), not at the wait's end.
            log_box = panel.locator(".widget-checkbox input[type=checkbox]")
            metric = panel.locator("select").first
            took = []
            for change, drawn in (
                (log_box.check, {"orch-metric-loss", "orch-log"}),
                (lambda: metric.select_option("rank/memory"), {"orch-metric-rank/memory", "orch-log"}),
            ):
                changed = time.monotonic()
                change()
                wait_until(
                    lambda drawn=drawn: drawn <= set(plot.evaluate("i => [...i.classList]")), 30, f"{drawn}"
                )
                took.append(time.monotonic() - changed)
                assert "WAITED" not in waiting.locator(".jp-Cell-outputWrapper").inner_text()
            print(f"\ncontrols drawn while a cell waited: log scale {took[0]:.2f}s, metric {took[1]:.2f}s")
            page.screenshot(path=str(ARTIFACTS / f"panel-controls-while-waiting{tail}.png"), full_page=True)
            clicked = time.monotonic()
            stop.click()
            # The run ended: the panel's output is now the record of its final state, as saved
            shown = page.locator(".jp-Notebook .jp-Cell").nth(2).locator(".jp-OutputArea-output")
            record = shown.locator(".orch-record")
            expect(record.locator("span.orch-state")).to_have_attribute(
                "data-state", "STOPPED", timeout=30_000
            )
            expect(waiting.locator(".jp-OutputArea-output")).to_contain_text("WAITED STOPPED", timeout=30_000)
            took = time.monotonic() - clicked
            print(f"\nStop clicked while a cell waited: its output came {took:.1f}s later")
            expect(shown.locator(".orch-panel")).to_have_count(0)
            expect(record.locator("tr.orch-rank")).to_have_count(4)
            expect(record.locator("img")).to_have_attribute("src", re.compile(r"^data:image/png;base64,"))
            assert record.locator("img").evaluate("i => i.complete && i.naturalWidth") > 0
            # The cell queued behind the wait ran after it, in order, and the page sent its
            # widget messages on subshells, or (subshells off) to the main shell only.
            following = page.locator(".jp-Notebook .jp-Cell").nth(4)
            expect(following.locator(".jp-OutputArea-output")).to_contain_text("NEXT STOPPED", timeout=30_000)
            subshells_used = int(following.locator(".jp-OutputArea-output").inner_text().split()[-1])
            assert (subshells_used > 0) == subshells, subshells_used
            # The output can come before the cell's reply: its prompt reads [*] until the reply does.
            for i, count in ((3, 4), (4, 5)):
                prompt = page.locator(".jp-Notebook .jp-Cell").nth(i).locator(".jp-InputPrompt")
                expect(prompt).to_have_text(re.compile(r"^\[\d+\]:$"), timeout=30_000)
                assert int(prompt.inner_text().strip("[]: ")) == count, prompt.inner_text()
            page.screenshot(path=str(ARTIFACTS / f"panel-stopped{tail}.png"), full_page=True)
        except BaseException:
            with contextlib.suppress(Exception):
                page.screenshot(path=str(ARTIFACTS / f"panel-failure{tail}.png"), full_page=True)
            raise


def write_record_notebook(path: Path, run_root: Path) -> None:
    """A notebook that shows the panels of a run that succeeds and of one that fails."""
    cells = [
        _code_cell(1, f"import sys\nsys.path.insert(0, {str(TESTS)!r})\nimport orch"),
        _code_cell(
            2,
            'run = orch.launch("jobs:allreduce_steps", world_size=4, config={"steps": 40, "sleep": 0.02},\n'
            f"                  run_root={str(run_root)!r})\n"
            "run.panel(interval=0.2)",
        ),
        _code_cell(3, 'print("WAITED", run.wait().state.value)'),
        _code_cell(
            4,
            f'failing = orch.launch("jobs:raise_on_rank1", world_size=2, run_root={str(run_root)!r})\n'
            "failing.panel(interval=0.2)",
        ),
        _code_cell(5, 'try:\n    failing.wait()\nexcept orch.RunFailed as e:\n    print("FAILED", e.rank)'),
        _code_cell(6, "run.close()\nfailing.close()"),
    ]
    nb = {
        "cells": cells,
        "metadata": {
            "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
            "language_info": {"name": "python"},
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    path.write_text(json.dumps(nb, indent=1))


@pytest.mark.timeout(480)
def test_a_saved_notebook_shows_each_panel_s_final_record_without_its_kernel(tmp_path: Path) -> None:
    from playwright.sync_api import expect

    root = tmp_path / "lab"
    root.mkdir()
    home = tmp_path / "home"
    home.mkdir()
    run_root = tmp_path / "runs"
    source = tmp_path / "record.ipynb"
    write_record_notebook(source, run_root)
    executed = root / "record.ipynb"
    proc = subprocess.run(
        [sys.executable, "-m", "jupyter", "execute", f"--output={executed}", str(source)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    # As JupyterLab saves a notebook it ran (by default): no widget state, signed, so trusted.
    # The copy nbclient wrote keeps the widget state and is not signed: untrusted.
    nb = nbformat.read(executed, as_version=4)
    nb.metadata.pop("widgets", None)
    (home / "data").mkdir()
    NotebookNotary(data_dir=str(home / "data")).sign(nb)
    nbformat.write(nb, root / "record-trusted.ipynb")
    ARTIFACTS.mkdir(exist_ok=True)

    with lab_browser(tmp_path, root, home, run_root, 1600) as (lab, ctx):
        for name in ("record", "record-trusted"):
            page = ctx.new_page()
            page.set_default_timeout(60_000)
            # its own workspace: no tab of the other notebook is restored over it
            page.goto(f"{lab.base}/lab/workspaces/{name}/tree/{name}.ipynb?token={lab.token}")
            cells = page.locator(".jp-Notebook .jp-Cell")
            expect(cells).to_have_count(6, timeout=90_000)
            shown = {}
            for index, state, ranks in ((1, "SUCCEEDED", 4), (3, "FAILED", 2)):
                out = cells.nth(index).locator(".jp-OutputArea-output")
                expect(out).to_have_count(1)
                expect(out).to_have_attribute("data-mime-type", "text/html")
                img = out.locator("img")
                expect(img).to_be_visible()
                expect(img).to_have_attribute("src", re.compile(r"^data:image/png;base64,"))
                wait_until(
                    lambda img=img: img.evaluate("i => i.complete && i.naturalWidth > 0"),
                    30,
                    "the picture to be decoded",
                )
                expect(out.locator("table tbody tr")).to_have_count(ranks)
                expect(out.locator("table")).to_be_visible()
                expect(out).to_contain_text(state)
                shown[state] = out.inner_text()
            assert "Root cause" in shown["FAILED"]
            assert "RuntimeError: boom on rank 1" in shown["FAILED"]
            assert "Root cause" not in shown["SUCCEEDED"]
            text = page.locator(".jp-Notebook").inner_text()
            assert "Error displaying widget" not in text and "VBox(" not in text
            for shot in (ARTIFACTS / f"{name}.png", Path(tempfile.gettempdir()) / f"orch-{name}.png"):
                page.screenshot(path=str(shot), full_page=True)
            page.close()


def keep_failure_logs(lab: Lab, run_root: Path) -> None:
    """Copy JupyterLab's log and the run's worker logs to test-artifacts/browser-failure/."""
    dest = ARTIFACTS / "browser-failure"
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    with contextlib.suppress(OSError):
        shutil.copy(lab.log_path, dest / "jupyterlab.log")
    with contextlib.suppress(OSError):
        shutil.copytree(run_root, dest / "runs")


def run_all_cells(page: Any, lab: Lab) -> None:
    """Run > Run All Cells, once the notebook's kernel is connected and idle.

    A click that lands before the page has connected to the kernel is dropped (no cell
    is even queued), so the click is repeated while every prompt still reads ``[ ]:``.
    """
    from playwright.sync_api import expect

    page.locator(".jp-Notebook .jp-Cell").first.wait_for()
    if lab.app == "lab":
        kernel_status = page.locator("#jp-main-statusbar .jp-StatusBar-TextItem[title^='Change kernel']")
        expect(kernel_status).to_have_text(re.compile(r"\| Idle$"), timeout=90_000)
    # (Notebook 7 has no status bar: the server says when the kernel is up and idle)
    wait_until(
        lambda: any(
            k.get("connections", 0) > 0 and k.get("execution_state") == "idle"
            for k in lab.api("GET", "/api/kernels")
        ),
        90,
        "the page to connect to its kernel",
    )
    prompts = page.locator(".jp-Notebook .jp-InputPrompt")
    for _attempt in range(3):
        page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
        page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
        try:
            wait_until(
                lambda: any(t.strip() not in ("", "[ ]:") for t in prompts.all_inner_texts()),
                10,
                "a cell to be queued",
            )
            return
        except AssertionError:
            continue
    raise AssertionError(f"Run All Cells queued no cell: {prompts.all_inner_texts()}")


def _step(rows: Any) -> int:
    """The step shown for rank 0 in the panel's table."""
    return int(rows.first.locator("td").nth(2).inner_text())


def write_sweep_notebook(path: Path, run_root: Path) -> None:
    """A sweep of three configs, one failing, with its panel; the next cell waits for it."""
    cells = [
        _code_cell(1, f"import sys\nsys.path.insert(0, {str(TESTS)!r})\nimport orch"),
        _code_cell(
            2,
            "configs = [\n"
            '    {"lr": 0.01, "steps": 300, "sleep": 0.03},\n'
            '    {"lr": 0.05, "fail": True},\n'
            '    {"lr": 0.2, "steps": 300, "sleep": 0.03},\n'
            "]\n"
            f'sweep = orch.sweep("jobs:lr_job", configs, world_size=2, run_root={str(run_root)!r})\n'
            "sweep.panel(interval=0.3)",
        ),
        _code_cell(3, 'results = sweep.wait()\nprint("SWEPT", [r["state"] for r in results])'),
    ]
    write_cells(path, cells)


@pytest.mark.timeout(300)
def test_sweep_panel_in_jupyterlab(tmp_path: Path) -> None:
    """The sweep panel as a page: live rows and curves, a row opening its run's per-rank panel
    while the next cell waits, then the sweep's record with the failure and the best run."""
    from playwright.sync_api import expect

    root, home, run_root = tmp_path / "lab", tmp_path / "home", tmp_path / "runs"
    root.mkdir()
    home.mkdir()
    write_sweep_notebook(root / "sweep_browser.ipynb", run_root)
    ARTIFACTS.mkdir(exist_ok=True)
    with lab_browser(tmp_path, root, home, run_root, 1400) as (lab, ctx):
        try:
            page = ctx.pages[0] if ctx.pages else ctx.new_page()
            page.set_default_timeout(60_000)
            page.goto(f"{lab.base}/lab/tree/sweep_browser.ipynb?token={lab.token}")
            run_all_cells(page, lab)

            panel = page.locator(".orch-sweep-panel")
            panel.wait_for(timeout=120_000)
            rows = panel.locator(".orch-trial-row")
            expect(rows).to_have_count(3)
            expect(rows.nth(0)).to_contain_text("RUNNING", timeout=120_000)
            expect(panel.locator("img").first).to_have_attribute("src", re.compile(r"^blob:|^data:"))
            # A click on the first run's button, while the next cell waits: its own panel opens.
            panel.get_by_role("button", name="#0", exact=True).click()
            opened = panel.locator(".orch-panel")
            expect(opened.locator("tr.orch-rank")).to_have_count(2, timeout=30_000)
            expect(panel.locator(".orch-opened")).to_have_attribute("data-index", "0")
            page.screenshot(path=str(ARTIFACTS / "sweep-panel.png"), full_page=True)

            # The sweep ends: its output becomes the record, with the failure and the best run.
            output = page.locator(".jp-Notebook .jp-Cell").nth(1).locator(".jp-OutputArea-output")
            record = output.locator(".orch-record")
            expect(record.locator(".orch-sweep-state")).to_have_attribute(
                "data-state", "done", timeout=120_000
            )
            expect(record.locator("tr.orch-trial")).to_have_count(3)
            expect(record.locator('tr.orch-trial[data-state="FAILED"]')).to_contain_text("was told to fail")
            expect(record.locator(".orch-best")).to_contain_text("best by final loss: #")
            assert record.locator("img").evaluate("i => i.complete && i.naturalWidth") > 0
            waiting = page.locator(".jp-Notebook .jp-Cell").nth(2).locator(".jp-OutputArea-output")
            expect(waiting).to_contain_text("SWEPT ['SUCCEEDED', 'FAILED', 'SUCCEEDED']", timeout=30_000)
            page.screenshot(path=str(ARTIFACTS / "sweep-record.png"), full_page=True)
        except BaseException:
            with contextlib.suppress(Exception):
                page.screenshot(path=str(ARTIFACTS / "sweep-failure.png"), full_page=True)
            raise


def write_pruned_sweep_notebook(path: Path, run_root: Path) -> None:
    """A sweep of five configs of the synthetic landscape under ASHA, with its panel."""
    cells = [
        _code_cell(1, f"import sys\nsys.path.insert(0, {str(TESTS)!r})\nimport orch"),
        _code_cell(
            2,
            'configs = [{"x": x, "steps": 30, "sleep": 0.05} for x in (15, 0, 26, 2, 18)]\n'
            f'sweep = orch.sweep("jobs:landscape_job", configs, run_root={str(run_root)!r},\n'
            "                   prune=orch.ASHA(grace=3, reduction=3))\n"
            "sweep.panel(interval=0.3)",
        ),
        _code_cell(3, 'results = sweep.wait()\nprint("SWEPT", [r["state"] for r in results])'),
    ]
    write_cells(path, cells)


@pytest.mark.timeout(300)
def test_pruned_sweep_panel_in_jupyterlab(tmp_path: Path) -> None:
    """The sweep panel of a pruned search as a page: PRUNED rows cut at their rung, the record."""
    from playwright.sync_api import expect

    root, home, run_root = tmp_path / "lab", tmp_path / "home", tmp_path / "runs"
    root.mkdir()
    home.mkdir()
    write_pruned_sweep_notebook(root / "pruned_browser.ipynb", run_root)
    ARTIFACTS.mkdir(exist_ok=True)
    with lab_browser(tmp_path, root, home, run_root, 1400) as (lab, ctx):
        try:
            page = ctx.pages[0] if ctx.pages else ctx.new_page()
            page.set_default_timeout(60_000)
            page.goto(f"{lab.base}/lab/tree/pruned_browser.ipynb?token={lab.token}")
            run_all_cells(page, lab)
            panel = page.locator(".orch-sweep-panel")
            panel.wait_for(timeout=120_000)
            expect(panel.locator(".orch-trial-row")).to_have_count(5)
            expect(panel.locator(".orch-trial-row").filter(has_text="PRUNED").first).to_contain_text(
                "PRUNED at 3", timeout=120_000
            )
            page.screenshot(path=str(ARTIFACTS / "sweep-pruned.png"), full_page=True)
            output = page.locator(".jp-Notebook .jp-Cell").nth(1).locator(".jp-OutputArea-output")
            record = output.locator(".orch-record")
            expect(record.locator(".orch-sweep-state")).to_have_attribute(
                "data-state", "done", timeout=120_000
            )
            expect(record.locator("tr.orch-trial")).to_have_count(5)
            assert record.locator('tr.orch-trial[data-state="PRUNED"]').count() >= 2
            expect(record.locator('tr.orch-trial[data-state="PRUNED"]').first).to_contain_text("PRUNED at 3")
            expect(record).to_contain_text("pruned (orch.ASHA(")
            assert record.locator("img").evaluate("i => i.complete && i.naturalWidth") > 0
            page.screenshot(path=str(ARTIFACTS / "sweep-pruned-record.png"), full_page=True)
        except BaseException:
            with contextlib.suppress(Exception):
                page.screenshot(path=str(ARTIFACTS / "sweep-pruned-failure.png"), full_page=True)
            raise


def write_nan_sweep_notebook(path: Path, run_root: Path) -> None:
    """A sweep of three configs, one of which diverges: NaN from step 12, after a 1e34 spike."""
    cells = [
        _code_cell(1, f"import sys\nsys.path.insert(0, {str(TESTS)!r})\nimport orch"),
        _code_cell(
            2,
            'configs = [{"lr": 0.05, "steps": 30}, {"lr": 0.1, "steps": 30, "nan_at": 12},\n'
            '           {"lr": 0.02, "steps": 30}]\n'
            f'sweep = orch.sweep("jobs:lr_job", configs, run_root={str(run_root)!r})\n'
            "sweep.panel(interval=0.3)",
        ),
        _code_cell(3, 'sweep.wait()\nprint("BEST", sweep.best("loss").config)'),
    ]
    write_cells(path, cells)


@pytest.mark.timeout(300)
def test_a_nan_sweep_in_jupyterlab(tmp_path: Path) -> None:
    """A diverged config as a page: flagged NaN from its step with its last finite value, sorted
    last, never the best, and its spike drawn at the plot's edge instead of flattening the others."""
    from playwright.sync_api import expect

    root, home, run_root = tmp_path / "lab", tmp_path / "home", tmp_path / "runs"
    root.mkdir()
    home.mkdir()
    write_nan_sweep_notebook(root / "nan_browser.ipynb", run_root)
    ARTIFACTS.mkdir(exist_ok=True)
    with lab_browser(tmp_path, root, home, run_root, 1400) as (lab, ctx):
        try:
            page = ctx.pages[0] if ctx.pages else ctx.new_page()
            page.set_default_timeout(60_000)
            page.goto(f"{lab.base}/lab/tree/nan_browser.ipynb?token={lab.token}")
            run_all_cells(page, lab)
            output = page.locator(".jp-Notebook .jp-Cell").nth(1).locator(".jp-OutputArea-output")
            record = output.locator(".orch-record")
            expect(record.locator(".orch-sweep-state")).to_have_attribute(
                "data-state", "done", timeout=180_000
            )
            expect(record).to_contain_text("nan from step 12")
            best = page.locator(".jp-Notebook .jp-Cell").nth(2).locator(".jp-OutputArea-output")
            expect(best).to_contain_text("BEST {", timeout=60_000)  # the diverged config is never the best
            assert "nan_at" not in best.inner_text()
            assert record.locator("img").evaluate("i => i.complete && i.naturalWidth") > 0
            page.screenshot(path=str(ARTIFACTS / "sweep-nan-record.png"), full_page=True)
        except BaseException:
            with contextlib.suppress(Exception):
                page.screenshot(path=str(ARTIFACTS / "sweep-nan-failure.png"), full_page=True)
            raise


def write_diverged_sweep_notebook(path: Path, run_root: Path) -> None:
    """Eight lrs, two of which diverge (lr_job's loss grows to 1e24, and to inf then NaN), the
    panel at once; the next cell waits and prints the plot's y range and the clipped runs."""
    lrs = [0.01, 0.03, 0.1, 0.2, 0.3, 0.4457453393648168, 2.0, 5.0]
    cells = [
        _code_cell(1, f"import sys\nsys.path.insert(0, {str(TESTS)!r})\nimport orch"),
        _code_cell(
            2,
            f'configs = [{{"lr": lr, "steps": 20, "sleep": 0.1}} for lr in {lrs!r}]\n'
            f'sweep = orch.sweep("jobs:lr_job", configs, parallel=4, run_root={str(run_root)!r})\n'
            "panel = sweep.panel(interval=0.3)\npanel",
        ),
        _code_cell(
            3,
            "sweep.wait()\ny = panel._plot.y_range\n"
            'print("YRANGE", y.lo, y.hi, sorted(c.curve for c in y.clipped))',
        ),
    ]
    write_cells(path, cells)


# The sweep panel's output, live or recorded: its overflow, each cell of the live table and of
# the record's results that passes the output's right edge, and the live cells' left edges by
# column (the header's first), which line up when every row's are the header's.
SWEEP_FIT = """out => {
    const right = out.getBoundingClientRect().right + 0.5;
    const over = [...out.querySelectorAll('.orch-cell, .orch-trial-nonfinite, .orch-trial-failure, '
                                          + '.orch-sweep-results th, .orch-sweep-results td')]
        .filter(e => e.getBoundingClientRect().right > right)
        .map(e => `${e.tagName} ${e.className} "${e.textContent.trim().slice(0, 30)}"`);
    const lefts = [...out.querySelectorAll('.orch-trial-head, .orch-trial-row')]
        .map(r => [...r.querySelectorAll('.orch-cell')].map(c => Math.round(c.getBoundingClientRect().left)));
    return {over, lefts, scroll: out.scrollWidth, client: out.clientWidth};
}"""


@pytest.mark.timeout(360)
def test_a_sweep_with_two_diverged_trials_fits_1100_px_and_its_curves_are_readable(tmp_path: Path) -> None:
    """Six lrs that converge and two that diverge, at 1,100 px with the file browser open: the
    plot's y range is the converging runs' (the two clipped at its top), the live rows line up
    under their header, and no cell of the live table or of the record passes the output's edge."""
    from playwright.sync_api import expect

    root, home, run_root = tmp_path / "lab", tmp_path / "home", tmp_path / "runs"
    root.mkdir()
    home.mkdir()
    write_diverged_sweep_notebook(root / "diverged.ipynb", run_root)
    ARTIFACTS.mkdir(exist_ok=True)
    with lab_browser(tmp_path, root, home, run_root, 1300, width=1100) as (lab, ctx):
        try:
            page = ctx.pages[0] if ctx.pages else ctx.new_page()
            page.set_default_timeout(60_000)
            page.goto(f"{lab.base}/lab/tree/diverged.ipynb?token={lab.token}")
            page.locator(".jp-Notebook .jp-Cell").first.wait_for()
            files = page.locator("#filebrowser")
            if not files.is_visible():  # JupyterLab's default layout has it open; make sure
                page.locator(".jp-SideBar [data-id='filebrowser']").click()
            expect(files).to_be_visible()
            run_all_cells(page, lab)

            output = page.locator(".jp-Notebook .jp-Cell").nth(1).locator(".jp-OutputArea-output")
            panel = output.locator(".orch-sweep-panel")
            expect(panel.locator(".orch-trial-row")).to_have_count(8, timeout=120_000)
            expect(panel.locator(".orch-trial-row").first).to_contain_text("0.01", timeout=60_000)
            live = output.evaluate(SWEEP_FIT)
            assert live["over"] == [] and live["scroll"] <= live["client"], live
            assert len(live["lefts"]) == 9 and all(row == live["lefts"][0] for row in live["lefts"]), live
            assert "0.4457453" not in panel.inner_text()  # lr 0.4457453393648168 as 0.4457

            record = output.locator(".orch-record")
            expect(record.locator(".orch-sweep-state")).to_have_attribute(
                "data-state", "done", timeout=240_000
            )
            waiting = page.locator(".jp-Notebook .jp-Cell").nth(2).locator(".jp-OutputArea-output")
            expect(waiting).to_contain_text("YRANGE", timeout=60_000)
            _, lo, hi, clipped = waiting.inner_text().split(" ", 3)
            # The converging runs start near 5 and end near 0: that is the axis; lr 2 and 5 are clipped.
            assert -1 < float(lo) < 0.5 and 4 < float(hi) < 10, waiting.inner_text()
            assert clipped.strip() == "[6, 7]", waiting.inner_text()
            expect(record.locator("tr.orch-trial")).to_have_count(8)
            expect(record).to_contain_text("best by final loss: #5 lr=0.4457, steps=20, sleep=0.1")
            assert "0.4457453" not in record.inner_text()
            assert record.locator("img").evaluate("i => i.complete && i.naturalWidth") > 0
            recorded = output.evaluate(SWEEP_FIT)
            assert recorded["over"] == [] and recorded["scroll"] <= recorded["client"], recorded
            output.evaluate("el => el.scrollIntoView({block: 'start'})")
            for where in (tmp_path / "sweep-diverged.png", ARTIFACTS / "sweep-diverged.png"):
                page.screenshot(path=str(where))
        except BaseException:
            with contextlib.suppress(Exception):
                page.screenshot(path=str(ARTIFACTS / "sweep-diverged-failure.png"), full_page=True)
            raise


def write_straggler_notebook(path: Path, run_root: Path) -> None:
    """4 ranks under DDP, rank 2 sleeping 30 ms per step in its compute; its panel."""
    cells = [
        _code_cell(1, f"import sys\nsys.path.insert(0, {str(TESTS)!r})\nimport orch"),
        _code_cell(
            2,
            'run = orch.launch("jobs:straggler", world_size=4, config={"slow_rank": 2, "delay": 0.03},\n'
            f"                  run_root={str(run_root)!r})\n"
            "run.panel(interval=0.3)",
        ),
    ]
    write_cells(path, cells)


# Each rank row's compute part width, in one evaluation of the page.
COMPUTE_WIDTHS = """p => [...p.querySelectorAll('tr.orch-rank')].map(r => {
    const e = r.querySelector('.orch-part[data-part="compute"]');
    return e ? e.getBoundingClientRect().width : 0;
})"""


@pytest.mark.timeout(300)
def test_the_straggler_in_the_panel(tmp_path: Path) -> None:
    """The panel as a page: each rank's step as a stacked bar, rank 2 marked the straggler in
    compute, and the judgement in words; then Stop."""
    from playwright.sync_api import expect

    root, home, run_root = tmp_path / "lab", tmp_path / "home", tmp_path / "runs"
    root.mkdir()
    home.mkdir()
    write_straggler_notebook(root / "straggler.ipynb", run_root)
    ARTIFACTS.mkdir(exist_ok=True)
    with lab_browser(tmp_path, root, home, run_root, 1200) as (lab, ctx):
        try:
            page = ctx.pages[0] if ctx.pages else ctx.new_page()
            page.set_default_timeout(60_000)
            page.goto(f"{lab.base}/lab/tree/straggler.ipynb?token={lab.token}")
            run_all_cells(page, lab)
            panel = page.locator(".orch-panel")
            rows = panel.locator("tr.orch-rank")
            expect(rows).to_have_count(4, timeout=120_000)
            expect(rows.nth(2).locator(".orch-slow")).to_have_text("straggler: compute", timeout=60_000)
            for i in (0, 1, 3):
                expect(rows.nth(i).locator(".orch-slow")).to_have_count(0)
            # Every rank's bar has its four parts; rank 2's compute is the widest of the four ranks'.
            expect(rows.nth(0).locator(".orch-split .orch-part")).to_have_count(4)
            # Read in one snapshot of the page (the panel redraws its table as beats arrive), until
            # a redraw shows it: a frame drawn from a window with few of rank 2's steps may not.
            seen: list[list[float]] = []

            def compute_widths() -> list[float] | None:
                widths: list[float] = panel.evaluate(COMPUTE_WIDTHS)
                seen.append(widths)
                ok = len(widths) == 4 and widths[2] == max(widths) and widths[2] > 1.3 * min(widths)
                return widths if ok else None

            try:
                until_value(compute_widths, 30)
            except AssertionError:
                raise AssertionError(f"rank 2's compute was never the widest: {seen[-5:]}") from None
            expect(panel.locator(".orch-stragglers")).to_contain_text(
                "rank 2 is the straggler, slow in compute"
            )
            page.screenshot(path=str(ARTIFACTS / "panel-straggler.png"), full_page=True)
            panel.get_by_role("button", name="Stop").click()
            record = page.locator(".jp-Notebook .jp-Cell").nth(1).locator(".orch-record")
            expect(record.locator(".orch-state")).to_have_attribute("data-state", "STOPPED", timeout=60_000)
        except BaseException:
            with contextlib.suppress(Exception):
                page.screenshot(path=str(ARTIFACTS / "panel-straggler-failure.png"), full_page=True)
            raise


def write_hang_notebook(path: Path, run_root: Path) -> None:
    """4 ranks under DDP; rank 1 blocks in its own code at step 10; the panel, then a cell that waits."""
    cells = [
        _code_cell(1, f"import sys\nsys.path.insert(0, {str(TESTS)!r})\nimport orch"),
        _code_cell(
            2,
            'run = orch.launch("jobs:hang_rank1", world_size=4, config={"at": 10}, hang_timeout=5,\n'
            f"                  run_root={str(run_root)!r})\n"
            "run.panel(interval=0.3)",
        ),
        _code_cell(3, "result = run.wait()\nprint('waited:', result.state.value)"),
    ]
    write_cells(path, cells)


@pytest.mark.timeout(300)
def test_a_hang_in_the_panel(tmp_path: Path) -> None:
    """The panel as a page while rank 1 hangs: "no progress", each rank marked, the grouped stacks
    with rank 1 named; then Stop, pressed while the next cell waits, ends the run STOPPED."""
    from playwright.sync_api import expect

    root, home, run_root = tmp_path / "lab", tmp_path / "home", tmp_path / "runs"
    root.mkdir()
    home.mkdir()
    write_hang_notebook(root / "hang.ipynb", run_root)
    ARTIFACTS.mkdir(exist_ok=True)
    with lab_browser(tmp_path, root, home, run_root, 1200) as (lab, ctx):
        try:
            page = ctx.pages[0] if ctx.pages else ctx.new_page()
            page.set_default_timeout(60_000)
            page.goto(f"{lab.base}/lab/tree/hang.ipynb?token={lab.token}")
            run_all_cells(page, lab)
            panel = page.locator(".orch-panel")
            expect(panel.locator("tr.orch-rank")).to_have_count(4, timeout=120_000)
            expect(panel.locator(".orch-progress")).to_contain_text("no progress for", timeout=60_000)
            expect(panel.locator(".orch-progress")).to_contain_text("ranks 0-3 at step 10")
            stacks = panel.locator(".orch-stacks")
            expect(stacks).to_contain_text("rank 1 (the odd one out): in `time.sleep(10**6)`", timeout=30_000)
            expect(stacks).to_contain_text("ranks 0, 2, 3: in `loss.backward()`")
            # rank 1 marked apart from the three ranks waiting on it
            expect(panel.locator(".orch-odd")).to_have_count(1)
            expect(panel.locator("tr.orch-rank[data-rank='1'] .orch-odd")).to_contain_text("the odd one out")
            expect(panel.locator(".orch-still")).to_have_count(3)
            expect(panel.locator(".orch-still").first).to_contain_text("waiting on rank 1 for ")
            expect(panel.locator(".orch-stragglers")).to_contain_text(
                "not judged while the ranks do not progress"
            )
            page.screenshot(path=str(ARTIFACTS / "panel-hang.png"), full_page=True)
            panel.get_by_role("button", name="Stacks").click()
            expect(panel.get_by_role("button", name="Stacks")).to_be_enabled(timeout=30_000)
            clicked = time.monotonic()
            panel.get_by_role("button", name="Stop").click()
            record = page.locator(".jp-Notebook .jp-Cell").nth(1).locator(".orch-record")
            expect(record.locator(".orch-state")).to_have_attribute("data-state", "STOPPED", timeout=60_000)
            stopped_in = time.monotonic() - clicked
            expect(record).to_contain_text("did not reach a step boundary within 10s and were terminated")
            # the stall kept as evidence in the record: its note and the grouped stacks
            expect(record.locator(".orch-progress")).to_contain_text("no progress for")
            expect(record.locator(".orch-stacks")).to_contain_text("rank 1 (the odd one out)")
            expect(page.locator(".jp-Notebook .jp-Cell").nth(2)).to_contain_text(
                "waited: STOPPED", timeout=30_000
            )
            page.screenshot(path=str(ARTIFACTS / "panel-hang-stopped.png"), full_page=True)
            assert stopped_in < 10 + 5, stopped_in
        except BaseException:
            with contextlib.suppress(Exception):
                page.screenshot(path=str(ARTIFACTS / "panel-hang-failure.png"), full_page=True)
            raise


def write_startup_notebook(path: Path, run_root: Path) -> None:
    """A cold kernel's first launch (its worker pool imports torch), rank 2 a straggler in a
    marked section; the panel at once."""
    cells = [
        _code_cell(1, f"import sys\nsys.path.insert(0, {str(TESTS)!r})\nimport orch"),
        _code_cell(
            2,
            'run = orch.launch("jobs:straggler", world_size=4,\n'
            '                  config={"slow_rank": 2, "delay": 0.03, "where": "augment"},\n'
            f"                  run_root={str(run_root)!r})\n"
            "run.panel(interval=0.3)",
        ),
    ]
    write_cells(path, cells)


# Every part of the panel's output that sticks out of it, in one evaluation of the page: the
# output area's overflow, and each header, cell and mark whose right edge passes its own.
CLIPPED = """out => {
    const right = out.getBoundingClientRect().right + 0.5;
    const over = [...out.querySelectorAll('.orch-ranks th, .orch-ranks td, .orch-slow, .orch-startup')]
        .filter(e => e.getBoundingClientRect().right > right)
        .map(e => `${e.tagName} ${e.className} "${e.textContent.trim().slice(0, 30)}"`);
    const table = out.querySelector('.orch-ranks');
    return {over, scroll: out.scrollWidth, client: out.clientWidth,
            table: table ? table.getBoundingClientRect().width : 0,
            output: out.getBoundingClientRect().width};
}"""


@pytest.mark.timeout(360)
def test_start_up_is_narrated_and_the_table_fits_1100_px_with_the_file_browser_open(tmp_path: Path) -> None:
    """At 1,100 px with JupyterLab's file browser open: while the cold start runs, the panel
    says what it waits for with the seconds moving; then no column of the rank table, and not
    the straggler's mark, passes the edge of the cell's output."""
    from playwright.sync_api import expect

    root, home, run_root = tmp_path / "lab", tmp_path / "home", tmp_path / "runs"
    root.mkdir()
    home.mkdir()
    write_startup_notebook(root / "startup.ipynb", run_root)
    ARTIFACTS.mkdir(exist_ok=True)
    with lab_browser(tmp_path, root, home, run_root, 900, width=1100) as (lab, ctx):
        try:
            page = ctx.pages[0] if ctx.pages else ctx.new_page()
            page.set_default_timeout(60_000)
            page.goto(f"{lab.base}/lab/tree/startup.ipynb?token={lab.token}")
            page.locator(".jp-Notebook .jp-Cell").first.wait_for()
            files = page.locator("#filebrowser")
            if not files.is_visible():  # JupyterLab's default layout has it open; make sure
                page.locator(".jp-SideBar [data-id='filebrowser']").click()
            expect(files).to_be_visible()
            run_all_cells(page, lab)

            panel = page.locator(".orch-panel")
            startup = panel.locator(".orch-startup")
            expect(startup).to_contain_text("importing torch", timeout=120_000)
            first = startup.inner_text()
            page.screenshot(path=str(ARTIFACTS / "panel-startup.png"))
            # Its seconds are the header's clock, counted from the launch: once, and moving.
            assert not re.search(r"\(\d+ s\)", first), first
            clock = panel.locator(".orch-elapsed")
            then = float(clock.inner_text().rstrip("s"))

            def later() -> bool:
                return startup.count() > 0 and float(clock.inner_text().rstrip("s")) > then

            wait_until(later, 60, "the start-up's clock to move")
            rows = panel.locator("tr.orch-rank")
            expect(rows).to_have_count(4, timeout=120_000)
            expect(startup).to_have_count(0, timeout=120_000)  # gone with the first step
            expect(rows.nth(2).locator(".orch-slow")).to_be_visible(timeout=120_000)
            output = page.locator(".jp-Notebook .jp-Cell").nth(1).locator(".jp-OutputArea-output")
            fit = output.evaluate(CLIPPED)
            print(f"\nat 1,100 px: table {fit['table']:.0f} px in an output of {fit['output']:.0f} px")
            assert fit["over"] == [], fit
            assert fit["scroll"] <= fit["client"], fit
            # What left the table is on hover: the rank's host and pid, the state's last heartbeat.
            assert "pid" in (rows.nth(0).locator("td.orch-where").get_attribute("title") or "")
            assert "heartbeat" in (rows.nth(0).locator("td").nth(1).get_attribute("title") or "")
            scores = rows.nth(2).locator("td.orch-step-time").get_attribute("title") or ""
            assert "the fastest rank's" in scores, scores
            # The table is redrawn at each poll, its rows replaced: scroll the output, which stays.
            output.evaluate("el => el.scrollIntoView({block: 'end'})")
            page.screenshot(path=str(ARTIFACTS / "panel-1100.png"))
            panel.get_by_role("button", name="Stop").click()
            record = page.locator(".jp-Notebook .jp-Cell").nth(1).locator(".orch-record")
            expect(record.locator(".orch-state")).to_have_attribute("data-state", "STOPPED", timeout=60_000)
            assert output.evaluate(CLIPPED)["over"] == []  # the record fits as well
        except BaseException:
            with contextlib.suppress(Exception):
                page.screenshot(path=str(ARTIFACTS / "panel-1100-failure.png"), full_page=True)
            raise


LIGHTNING_CELL = """import time

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

import orch
from orch.integrations.lightning import OrchCallback, OrchLogger


def train(ctx=None):
    class Regression(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(8, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.log("train_loss", loss)
            time.sleep(0.03)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    x = torch.randn(512, 8, generator=torch.Generator().manual_seed(0))
    loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=16)
    trainer = L.Trainer(
        strategy="ddp", accelerator="cpu", devices=2, max_epochs=500, log_every_n_steps=1,
        logger=OrchLogger(), callbacks=[OrchCallback()], enable_progress_bar=False,
        enable_checkpointing=False, enable_model_summary=False,
    )
    trainer.fit(Regression(), loader)
"""


@pytest.mark.timeout(300)
def test_the_panel_draws_a_lightning_run(tmp_path: Path) -> None:
    """Lightning code from a cell (strategy="ddp", devices=2, OrchLogger): the panel shows its
    two ranks and draws train_loss, redrawn as training runs; Stop ends it STOPPED on both."""
    from playwright.sync_api import expect

    root, home, run_root = tmp_path / "lab", tmp_path / "home", tmp_path / "runs"
    root.mkdir()
    home.mkdir()
    cells = [
        _code_cell(1, LIGHTNING_CELL),
        _code_cell(
            2, f"run = orch.launch(train, world_size=2, run_root={str(run_root)!r})\nrun.panel(interval=0.3)"
        ),
    ]
    write_cells(root / "lightning.ipynb", cells)
    ARTIFACTS.mkdir(exist_ok=True)
    with lab_browser(tmp_path, root, home, run_root, 1100) as (lab, ctx):
        try:
            page = ctx.pages[0] if ctx.pages else ctx.new_page()
            page.set_default_timeout(60_000)
            page.goto(f"{lab.base}/lab/tree/lightning.ipynb?token={lab.token}")
            run_all_cells(page, lab)
            panel = page.locator(".orch-panel")
            rows = panel.locator("tr.orch-rank")
            plot = panel.locator("img")
            expect(rows).to_have_count(2, timeout=120_000)
            state = panel.locator("span.orch-state")
            expect(state).to_have_attribute("data-state", "RUNNING", timeout=120_000)
            expect(panel.locator("select").first).to_have_value("train_loss", timeout=120_000)
            wait_until(lambda: _step(rows) > 10, 120, "Lightning's steps in the table")
            src1, step1 = plot.get_attribute("src"), _step(rows)
            wait_until(
                lambda: _step(rows) > step1 + 5 and plot.get_attribute("src") != src1,
                60,
                "the plot to be redrawn",
            )
            # Lightning's own progress: the run's length from the Trainer (500 epochs x 16 steps)
            expect(panel).to_contain_text("/8000", timeout=30_000)
            output = page.locator(".jp-Notebook .jp-Cell").nth(1).locator(".jp-OutputArea-output")
            output.evaluate("el => el.scrollIntoView({block: 'start'})")
            page.screenshot(path=str(ARTIFACTS / "panel-lightning.png"))
            panel.get_by_role("button", name="Stop").click()
            record = page.locator(".jp-Notebook .jp-Cell").nth(1).locator(".orch-record")
            expect(record.locator(".orch-state")).to_have_attribute("data-state", "STOPPED", timeout=60_000)
            states = record.locator("tr.orch-rank").evaluate_all(
                "rs => rs.map(r => r.querySelectorAll('td')[1].innerText.trim())"
            )
            assert states == ["STOPPED", "STOPPED"], states
        except BaseException:
            with contextlib.suppress(Exception):
                page.screenshot(path=str(ARTIFACTS / "panel-lightning-failure.png"), full_page=True)
            raise


# Where the screenshots of the gang's and the quiet panels go: test-artifacts/, or $ORCH_SHOTS.
SHOTS = Path(os.environ.get("ORCH_SHOTS") or ARTIFACTS)

GANG_BUILD = """%%orch gang
from time import sleep

import torch

torch.manual_seed(0)
model = ctx.ddp(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
x = torch.randn(64, 4)
y = x.sum(1, keepdim=True)


def train(steps):
    for step in ctx.steps(steps):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        ctx.log(step, loss=loss.item())
        sleep(0.02)
    return loss.item()"""
# The kernel imports `time`; the ranks never do (the build takes `sleep` alone), so the cell
# that uses `time` fails on them with the hint that says how to give it to the ranks.
GANG_CELLS = [
    "import time\n\nimport orch\n\ngang = orch.gang(world_size=2, run_root={root!r})",
    GANG_BUILD,
    "%%orch gang\ntrain(40)",
    "%%orch gang\nfor group in opt.param_groups:\n    group['lr'] = 0.1",
    "%%orch gang\ntrain(40)",
    'model = gang.pull("model")\nprint("PULLED", round(model.weight.sum().item(), 6))',
    "gang.panel()",
    # The barrier: every rank has set `kept` before one fails (a peer's failure interrupts the others).
    "%%orch gang\nkept = opt.param_groups[0]['lr']\ntorch.distributed.barrier()\nstarted = time.monotonic()",
    "%%orch gang\nprint('KEPT', kept, round(model.module.weight.sum().item(), 6))",
    "gang.close()",
]


@pytest.mark.timeout(420)
def test_a_gang_used_across_three_cells_in_jupyterlab(tmp_path: Path) -> None:
    """%%orch gang cells in JupyterLab at 1,100 px, the file browser open: build, train 40
    steps, set the lr, train 40 more, pull the model, then the gang's panel. Each call's panel
    gives way to its record (2 ranks, SUCCEEDED), the training cells' Out is rank 0's loss, the
    second training goes on from where the first left off. The gang's panel draws the calls as
    one session: its table lists every call but the pull, the training calls' steps going on
    (0-39, then 40-79), the lr cell with no loss logged; its image fits, nothing scrolls
    sideways. A cell that uses the kernel's `time` fails naming its own count (Cell In[N],
    line 3) with the hint to import it in the cell, and the gang keeps its ranks and their
    names: the next cell prints what the failed cell set and the model's trained weights."""
    from playwright.sync_api import expect

    root, home, run_root = tmp_path / "lab", tmp_path / "home", tmp_path / "runs"
    root.mkdir()
    home.mkdir()
    cells = [
        _code_cell(i + 1, c.format(root=str(run_root)) if i == 0 else c) for i, c in enumerate(GANG_CELLS)
    ]
    write_cells(root / "gang.ipynb", cells)
    ARTIFACTS.mkdir(exist_ok=True)
    SHOTS.mkdir(parents=True, exist_ok=True)
    with lab_browser(tmp_path, root, home, run_root, 1000, width=1100) as (lab, ctx):
        try:
            page = ctx.pages[0] if ctx.pages else ctx.new_page()
            page.set_default_timeout(60_000)
            page.goto(lab.notebook_url("gang.ipynb"))
            page.locator(".jp-Notebook .jp-Cell").first.wait_for()
            files = page.locator("#filebrowser")
            if not files.is_visible():  # JupyterLab's default layout has it open; make sure
                page.locator(".jp-SideBar [data-id='filebrowser']").click()
            expect(files).to_be_visible()
            run_all_cells(page, lab)
            cell = page.locator(".jp-Notebook .jp-Cell")
            # Run All stops at the failing cell (the kernel drops the cells queued behind it).
            failing = cell.nth(7)
            error = failing.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
            expect(error).to_contain_text("RunFailed", timeout=240_000)
            outs = []
            for i in (1, 2, 3, 4):
                record = cell.nth(i).locator(".orch-record")
                expect(record.locator(".orch-state")).to_have_attribute(
                    "data-state", "SUCCEEDED", timeout=60_000
                )
                if i in (1, 3):  # the build, the lr: they log nothing, so no empty plot or table
                    expect(record.locator(".orch-ranks-line")).to_have_text("2 ranks, both SUCCEEDED")
                    expect(record.locator("img")).to_have_count(0)
                    expect(record.locator(".orch-no-points")).to_have_text("no points were logged")
                    expect(record.locator(".orch-stragglers")).to_have_count(0)
                else:
                    expect(record.locator("tr.orch-rank")).to_have_count(2)
                    outs.append(cell.nth(i).locator(".jp-OutputArea-executeResult").all_inner_texts())
            first, second = (float(o[0].split()[-1]) for o in outs)  # the Out, after its prompt
            assert second < first, (first, second)  # trained on from where the first call left off
            pulled = cell.nth(5).locator(".jp-OutputArea")
            expect(pulled).to_contain_text("PULLED")
            weights = pulled.inner_text().split()[-1]

            # The gang's panel: one session, every call but the pull in its table.
            gang_out = cell.nth(6).locator(".jp-OutputArea-output")
            table = gang_out.locator("table.orch-gang-calls")
            calls = table.locator("tr.orch-gang-call")
            expect(calls).to_have_count(4, timeout=60_000)  # build, train, lr, train: no pull
            rows = [[td.strip() for td in r.locator("td").all_inner_texts()] for r in calls.all()]
            print(f"\nthe gang's calls: {rows}")
            labels = [r[0] for r in rows]
            for n, label in enumerate(labels, start=1):  # named as the call and the cell it was
                assert label.startswith(f"call {n}: cell In[{n + 1}]"), labels
            assert all(r[1] == "SUCCEEDED" for r in rows), rows
            assert rows[1][2] == "0\u201339" and rows[3][2] == "40\u201379", rows  # the steps go on (en dash)
            assert rows[2][2] == "-" and rows[2][3] == "no loss logged", rows  # the lr's cell
            assert rows[0][3] == "no loss logged", rows
            assert float(rows[3][3]) < float(rows[1][3]), rows  # last losses: it went on down
            expect(table).not_to_contain_text("pull")
            fit = gang_out.evaluate(SCROLLS)
            print(f"gang panel at 1,100 px: {fit}")
            assert fit["scrolls"] == [] and fit["scroll"] <= fit["client"], fit
            assert fit["image"] is not None and fit["image"][0] > 0, fit  # drawn, and loaded
            assert fit["image"][1] <= fit["output"] + 0.5, fit
            cell.nth(6).evaluate("el => el.scrollIntoView({block: 'start'})")
            page.screenshot(path=str(SHOTS / "gang-panel.png"))

            # The failing cell: named by its own count, with the way to give the ranks `time`.
            expect(failing.locator(".jp-InputPrompt")).to_have_text(re.compile(r"\[\d+\]:"), timeout=30_000)
            prompt = failing.locator(".jp-InputPrompt").inner_text().strip()
            found = re.fullmatch(r"\[(\d+)\]:", prompt)
            assert found, prompt
            shown = error.inner_text()
            assert f"Cell In[{found[1]}], line 3" in shown, (prompt, shown)
            assert "name 'time' is not defined" in shown, shown
            assert "`time` is the kernel's, not the ranks'" in shown and "(`import time`)" in shown, shown
            assert "kept its ranks and their ctx.state" in shown, shown
            failing.evaluate("el => el.scrollIntoView({block: 'start'})")
            page.screenshot(path=str(SHOTS / "gang-failed-cell.png"))

            # The cells after it, run from the next one: the gang kept its ranks' names.
            after = cell.nth(8)
            after.locator(".jp-InputPrompt").click()
            page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
            page.get_by_role("menuitem", name="Run Selected Cell and All Below", exact=True).click()
            printed = after.locator(".jp-OutputArea")
            expect(printed).to_contain_text("KEPT", timeout=120_000)
            expect(printed).to_contain_text(f"KEPT 0.1 {weights}")
            state = after.locator(".orch-record .orch-state")
            expect(state).to_have_attribute(
                "data-state", re.compile("SUCCEEDED|FAILED|STOPPED"), timeout=60_000
            )
            assert state.get_attribute("data-state") == "SUCCEEDED", after.locator(
                ".orch-record"
            ).inner_text()
            expect(cell.nth(9).locator(".jp-InputPrompt")).to_have_text(
                re.compile(r"\[\d+\]:"), timeout=60_000
            )
            after.evaluate("el => el.scrollIntoView({block: 'start'})")
            page.screenshot(path=str(SHOTS / "gang-cell-after-failure.png"))
        except BaseException:
            with contextlib.suppress(Exception):
                page.screenshot(path=str(ARTIFACTS / "gang-failure.png"), full_page=True)
            raise


# Every element of an output that scrolls sideways, and the output's own widths.
SCROLLS = """out => {
    const scrolls = [out, ...out.querySelectorAll('*')]
        .filter(e => e.scrollWidth > e.clientWidth && getComputedStyle(e).overflowX !== 'visible')
        .map(e => `${e.tagName}.${[...e.classList].join('.')} ${e.scrollWidth} > ${e.clientWidth}`);
    const panel = out.querySelector('.orch-panel');
    const img = out.querySelector('img');
    return {scrolls, scroll: out.scrollWidth, client: out.clientWidth,
            panel: panel ? [panel.scrollWidth, panel.clientWidth] : null,
            image: img ? [img.complete && img.naturalWidth, img.getBoundingClientRect().width] : null,
            output: out.getBoundingClientRect().width};
}"""


def write_quiet_notebook(path: Path, run_root: Path) -> None:
    """A run that fails before it logs anything, a gang's setup cell, then a live run."""
    root = str(run_root)
    cells = [
        _code_cell(1, f"import sys\nsys.path.insert(0, {str(TESTS)!r})\nimport orch"),
        _code_cell(
            2,
            f'failing = orch.launch("jobs:fails_at_startup", world_size=2, run_root={root!r})\n'
            "failing.panel(interval=0.2)",
        ),
        _code_cell(3, 'try:\n    failing.wait()\nexcept orch.RunFailed as e:\n    print("FAILED", e.rank)'),
        _code_cell(4, f"gang = orch.gang(world_size=2, run_root={root!r})"),
        _code_cell(5, GANG_BUILD),
        _code_cell(6, "gang.close()"),
        _code_cell(
            7,
            'run = orch.launch("jobs:allreduce_steps", world_size=2,\n'
            f'                  config={{"steps": 100000, "sleep": 0.05}}, run_root={root!r})\n'
            "run.panel(interval=0.3)",
        ),
    ]
    write_cells(path, cells)


@pytest.mark.timeout(420)
def test_quiet_panels_at_1100_px(tmp_path: Path) -> None:
    """At 1,100 px, JupyterLab's file browser open: a run that failed before it logged a point
    shows no plot and no table of dashes, only what there is (its ranks' states, the root cause,
    rank 0's last lines); a gang's setup cell, which logs nothing, shows its state and a line;
    a live panel fits its output, with no horizontal scrollbar."""
    from playwright.sync_api import expect

    root, home, run_root = tmp_path / "lab", tmp_path / "home", tmp_path / "runs"
    root.mkdir()
    home.mkdir()
    write_quiet_notebook(root / "quiet.ipynb", run_root)
    SHOTS.mkdir(parents=True, exist_ok=True)
    with lab_browser(tmp_path, root, home, run_root, 900, width=1100) as (lab, ctx):
        try:
            page = ctx.pages[0] if ctx.pages else ctx.new_page()
            page.set_default_timeout(60_000)
            page.goto(lab.notebook_url("quiet.ipynb"))
            page.locator(".jp-Notebook .jp-Cell").first.wait_for()
            files = page.locator("#filebrowser")
            if not files.is_visible():
                page.locator(".jp-SideBar [data-id='filebrowser']").click()
            expect(files).to_be_visible()
            run_all_cells(page, lab)
            cells = page.locator(".jp-Notebook .jp-Cell")

            failed = cells.nth(1).locator(".orch-record")
            expect(failed.locator(".orch-state")).to_have_attribute("data-state", "FAILED", timeout=120_000)
            expect(failed.locator(".orch-no-points")).to_have_text("no points were logged")
            expect(failed.locator("img")).to_have_count(0)
            expect(failed.locator("table.orch-ranks")).to_have_count(0)
            expect(failed.locator(".orch-ranks-line")).to_contain_text("FAILED")
            expect(failed.locator(".orch-failure")).to_contain_text("missing_dependency")
            expect(failed.locator(".orch-output")).to_contain_text("ImportError")
            expect(failed).not_to_contain_text("not judged")
            cells.nth(1).evaluate("el => el.scrollIntoView({block: 'start'})")
            page.screenshot(path=str(SHOTS / "failed-run-logged-nothing.png"))

            setup = cells.nth(4).locator(".orch-record")
            expect(setup.locator(".orch-state")).to_have_attribute("data-state", "SUCCEEDED", timeout=180_000)
            expect(setup.locator(".orch-ranks-line")).to_have_text("2 ranks, both SUCCEEDED")
            expect(setup.locator("img")).to_have_count(0)
            expect(setup.locator("table")).to_have_count(0)
            expect(setup).not_to_contain_text("not judged")
            cells.nth(4).evaluate("el => el.scrollIntoView({block: 'start'})")
            page.screenshot(path=str(SHOTS / "gang-setup-cell.png"))

            live = cells.nth(6)
            panel = live.locator(".orch-panel")
            expect(panel.locator("tr.orch-rank")).to_have_count(2, timeout=180_000)
            expect(panel.locator("img.orch-plot")).to_be_visible()
            output = live.locator(".jp-OutputArea-output")
            wait_until(lambda: _step(panel.locator("tr.orch-rank")) > 20, 60, "the run to train")
            fit = output.evaluate(SCROLLS)
            print(f"\nlive panel at 1,100 px: {fit}")
            assert fit["scrolls"] == [] and fit["scroll"] <= fit["client"], fit
            assert fit["panel"] is not None and fit["panel"][0] <= fit["panel"][1], fit
            live.evaluate("el => el.scrollIntoView({block: 'start'})")
            page.screenshot(path=str(SHOTS / "live-panel-1100.png"))
            page.locator(".jp-SideBar [data-id='filebrowser']").click()  # closed: a wider output
            expect(files).to_be_hidden()
            wait_until(lambda: output.evaluate(SCROLLS)["client"] > 800, 10, "the output to widen")
            wide = output.evaluate(SCROLLS)
            assert wide["scrolls"] == [] and wide["panel"][0] <= wide["panel"][1], wide
            panel.get_by_role("button", name="Stop").click()
            record = live.locator(".orch-record")
            expect(record.locator(".orch-state")).to_have_attribute("data-state", "STOPPED", timeout=60_000)
            assert output.evaluate(SCROLLS)["scrolls"] == []  # the record fits as well
        except BaseException:
            with contextlib.suppress(Exception):
                page.screenshot(path=str(SHOTS / "quiet-failure.png"), full_page=True)
            raise
