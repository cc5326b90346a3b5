"""Every notebook in ``notebooks/``, run as a person runs it: JupyterLab in headless Chromium,
Run → Run All Cells, then File → Save. Then, at 1366×768 (a laptop, file browser open) and
1920×1080:

* no figure reaches past its output area, and no output holding a figure or a widget scrolls
  sideways (a wide table may: that is how JupyterLab shows one);
* no legend overlaps its plot's frame (where the glyphs are drawn): bounding boxes from the
  BokehJS views;
* the saved notebook holds no error output and weighs less than 1 MB.

JupyterLab runs once for the module (a fresh copy of the notebooks, the data linked); each
notebook gets a fresh kernel. Needs JupyterLab (the ``notebook`` extra), Selenium and
Debian's ``chromium`` + ``chromium-driver``; skips with the reason where they are missing
(CI installs them).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from sapptk import viz

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
SIZES = ((1366, 768), (1920, 1080))
MAX_SAVED_BYTES = 1_000_000
RUN_SECONDS = 900  # per notebook, under load

pytest.importorskip("selenium", reason="needs selenium: pip install 'sapptk[export]'")
pytest.importorskip("jupyterlab", reason="needs JupyterLab: pip install 'sapptk[notebook]'")
if viz.find_chromium() is None:
    pytest.skip("needs Chromium: apt-get install chromium chromium-driver", allow_module_level=True)

pytestmark = pytest.mark.slow  # JupyterLab, a kernel per notebook and a browser: minutes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Lab:
    """A JupyterLab server on a copy of the notebooks, and its REST API."""

    def __init__(self, where: Path) -> None:
        self.root = where / "root"
        (self.root / "tests").mkdir(parents=True)
        shutil.copytree(ROOT / "notebooks", self.root / "notebooks")
        (self.root / "data").symlink_to(ROOT / "data")
        (self.root / "tests" / "data").symlink_to(ROOT / "tests" / "data")
        settings = where / "settings" / "@jupyterlab" / "apputils-extension"
        settings.mkdir(parents=True)
        (settings / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
        self.port, self.token = _free_port(), "sapptk-browser-test"
        env = {**os.environ, "JUPYTERLAB_SETTINGS_DIR": str(where / "settings"),
               "JUPYTERLAB_WORKSPACES_DIR": str(where / "workspaces"), "JUPYTER_RUNTIME_DIR": str(where / "runtime")}
        self.log = (where / "lab.log").open("w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={self.port}", "--ip=127.0.0.1",
             f"--ServerApp.token={self.token}", f"--ServerApp.root_dir={self.root}", "--allow-root",
             "--LabApp.news_url=", "--ServerApp.open_browser=False"],
            stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=self.root,
        )
        deadline = time.monotonic() + 120
        while True:
            try:
                self.api("status")
                break
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"JupyterLab did not start: see {where / 'lab.log'}") from None
                time.sleep(0.5)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/{path}?token={self.token}"

    def api(self, path: str, method: str = "GET") -> object:
        request = urllib.request.Request(self.url(f"api/{path}"), method=method)
        with urllib.request.urlopen(request, timeout=10) as reply:
            return json.loads(reply.read() or b"null")

    def close_sessions(self) -> None:
        for session in self.api("sessions"):
            self.api(f"sessions/{session['id']}", "DELETE")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.log.close()


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    server = Lab(tmp_path_factory.mktemp("lab"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def driver():
    drv = viz.chromium_driver(console_log=True, window=SIZES[0])
    yield drv
    viz.close_driver(drv)


def _menu(driver, menu: str, command: str) -> None:
    from selenium.webdriver.common.by import By

    label = next(e for e in driver.find_elements(By.CSS_SELECTOR, ".lm-MenuBar-itemLabel") if e.text == menu)
    label.click()
    item = f'li.lm-Menu-item[data-command="{command}"]'
    deadline = time.monotonic() + 10
    while not driver.find_elements(By.CSS_SELECTOR, item):
        assert time.monotonic() < deadline, f"no menu item {command}"
        time.sleep(0.1)
    driver.find_element(By.CSS_SELECTOR, item).click()


def _wait(condition, seconds: float, what: str, poll: float = 1.0):
    deadline = time.monotonic() + seconds
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out: {what}"
        time.sleep(poll)


_PROMPTS = "return Array.from(document.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt')).map(e => e.textContent)"

NARROW = 0.85  # a stretching figure takes at least this share of its output's width

# every Bokeh view on the page: roots wider than their output area (or, stretching, much
# narrower), legends over their frame
_LAYOUT = f"const NARROW = {NARROW}\n" + """
const views = []
const walk = v => { views.push(v); let kids = []; try { kids = Array.from(v.children()) } catch (e) {}
                    for (const k of kids) walk(k) }
if (typeof Bokeh !== "undefined") for (const r of Bokeh.index.roots) walk(r)
const wide = []
for (const r of (typeof Bokeh !== "undefined" ? Bokeh.index.roots : [])) {
  const box = r.el.getBoundingClientRect()
  const out = r.el.closest('.jp-OutputArea-output')
  if (box.width === 0 || out === null) continue  // in a hidden tab
  const area = out.getBoundingClientRect()
  if (box.right > area.right + 1) wide.push([r.model.type, Math.round(box.width), Math.round(area.width)])
}
// a figure made to stretch that stays narrow in its output (a widget box that does not give it the width)
const narrow = []
for (const r of (typeof Bokeh !== "undefined" ? Bokeh.index.roots : [])) {
  const box = r.el.getBoundingClientRect()
  const out = r.el.closest('.jp-OutputArea-output')
  if (box.width === 0 || out === null || r.model.sizing_mode !== 'stretch_width') continue
  const area = out.getBoundingClientRect()
  if (box.width < NARROW * area.width) narrow.push([r.model.type, Math.round(box.width), Math.round(area.width)])
}
const scrolling = Array.from(document.querySelectorAll('.jp-OutputArea-output'))
  .filter(o => o.clientWidth > 0 && o.scrollWidth > o.clientWidth + 1)
  .filter(o => o.querySelector('[class^="bk-"], [class*=" bk-"]') !== null
               || o.getAttribute('data-mime-type') === 'application/vnd.jupyter.widget-view+json')
  .map(o => [o.getAttribute('data-mime-type'), (o.firstElementChild || o).className, o.scrollWidth, o.clientWidth])
const over = []
let legends = 0
for (const v of views) {
  if (v.model.type !== 'Legend' || !v.model.visible || v.el === undefined && v.bbox === undefined) continue
  const frame = v.parent && v.parent.frame ? v.parent.frame.bbox : null
  if (frame === null || v.bbox.width === 0) continue
  legends += 1
  const b = v.bbox
  const dx = Math.min(b.x1, frame.x1) - Math.max(b.x0, frame.x0)
  const dy = Math.min(b.y1, frame.y1) - Math.max(b.y0, frame.y0)
  if (dx > 1 && dy > 1) over.push([v.parent.model.title ? v.parent.model.title.text : '', b.x0, b.y0, b.x1, b.y1])
}
// numeric tick labels that may overlap (no NoOverlap policy); categorical rows too short for a label
const ticks = []
for (const v of views) {
  if (!v.model.type.endsWith('Axis') || !v.model.visible || !v.parent || !v.parent.frame) continue
  const plot = v.parent.model, frame = v.parent.frame.bbox
  if (!plot || !Array.isArray(plot.left) || frame.width === 0) continue  // a colour bar's own axis
  const title = plot.title && plot.title.text ? plot.title.text : ''
  if (v.model.type === 'CategoricalAxis') {
    const vertical = plot.left.includes(v.model) || plot.right.includes(v.model)
    const range = vertical ? plot.y_range : plot.x_range
    const px = (vertical ? frame.height : frame.width) / Math.max(range.factors.length, 1)
    const chars = Math.max(1, ...range.factors.map(f => String(f).length))
    if (vertical ? px < 14 : px < 7 * chars) ticks.push([title, v.model.type, Math.round(px)])
  } else if (v.model.major_label_policy.type !== 'NoOverlap') ticks.push([title, v.model.type, 'no NoOverlap'])
}
// K/V panes: the K/V lines fill at least half their scale (not flat under a memory axis)
const kv = []
for (const v of views) {
  if (v.model.type !== 'GlyphRenderer' || v.model.name !== 'kv' || !v.parent || !v.parent.model) continue
  let top = 0
  for (const x of v.model.data_source.data.memory_mb) top = Math.max(top, x)
  const plot = v.parent.model
  const range = v.model.y_range_name === 'default' ? plot.y_range : plot.extra_y_ranges.get(v.model.y_range_name)
  kv.push([Math.round(top), Math.round(range.end - range.start)])
}
const sidebar = document.querySelector('.jp-FileBrowser')
const outputs = Array.from(document.querySelectorAll('.jp-OutputArea-output'))
const nroots = typeof Bokeh !== "undefined" ? Bokeh.index.roots.length : 0
return {roots: nroots, wide, narrow, scrolling, over, legends, ticks, kv,
        output_px: Math.max(0, ...outputs.map(o => o.clientWidth)),
        file_browser_px: sidebar ? sidebar.offsetWidth : 0}
"""


def _run_all(lab: Lab, driver, name: str) -> float:
    """Open ``notebooks/<name>`` in a fresh workspace and kernel, Run All, wait until every
    cell ran and the kernel is idle; the seconds it took."""
    lab.close_sessions()  # a fresh kernel for every notebook
    driver.set_window_size(*SIZES[0])
    driver.get(lab.url(f"lab/tree/notebooks/{name}") + "&reset")  # a fresh workspace: nothing else reopens
    _wait(lambda: driver.execute_script(_PROMPTS), 120, "the notebook to open", poll=0.5)
    _wait(lambda: any(s["kernel"]["execution_state"] == "idle" for s in lab.api("sessions")), 120, "the kernel")
    began = time.monotonic()
    _menu(driver, "Run", "runmenu:run-all")
    _wait(lambda: all(p.strip() not in ("[*]:", "[ ]:", "") for p in driver.execute_script(_PROMPTS)),
          RUN_SECONDS, f"{name} to run")
    _wait(lambda: all(s["kernel"]["execution_state"] == "idle" for s in lab.api("sessions")), 60, "idle")
    seconds = time.monotonic() - began
    time.sleep(2)  # the last figures lay out
    return seconds


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs_fits_and_stays_lean_in_jupyterlab(lab, driver, path):
    name = path.name
    saved = lab.root / "notebooks" / name
    before = saved.stat().st_mtime_ns
    seconds = _run_all(lab, driver, name)

    layouts = {}
    for size in SIZES:
        driver.set_window_size(*size)
        time.sleep(2)
        layouts[size] = driver.execute_script(_LAYOUT)
    _menu(driver, "File", "docmanager:save")
    _wait(lambda: saved.stat().st_mtime_ns != before, 60, "the save", poll=0.5)
    time.sleep(1)
    book = json.loads(saved.read_text(encoding="utf-8"))
    size_bytes = saved.stat().st_size
    print(f"{name}: ran in {seconds:.0f} s, saved {size_bytes:,} bytes, "
          + ", ".join(f"{w}x{h}: {lay['roots']} figures, output {lay['output_px']} px" for (w, h), lay in
                      layouts.items()))

    errors = [(i, o.get("ename"), o.get("evalue")) for i, c in enumerate(book["cells"]) if c["cell_type"] == "code"
              for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, errors
    assert all(c.get("execution_count") for c in book["cells"] if c["cell_type"] == "code"), "a cell did not run"
    assert size_bytes < MAX_SAVED_BYTES, f"{name}: {size_bytes:,} bytes saved after Run All"
    assert layouts[SIZES[0]]["file_browser_px"] > 100, "the file browser should be open, as a person has it"
    for size, lay in layouts.items():
        assert not lay["wide"], f"{name} at {size}: figures wider than their output area: {lay['wide']}"
        assert not lay["narrow"], f"{name} at {size}: stretching figures narrower than their output: {lay['narrow']}"
        assert not lay["scrolling"], f"{name} at {size}: outputs that scroll sideways: {lay['scrolling']}"
        assert not lay["over"], f"{name} at {size}: legends over the plot: {lay['over']}"
        assert not lay["ticks"], f"{name} at {size}: tick labels that may overlap: {lay['ticks']}"
        assert all(top >= 0.5 * span for top, span in lay["kv"]), f"{name} at {size}: K/V flat: {lay['kv']}"
    severe = [e["message"] for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
    assert not severe, severe


# an Explorer on a small profile: a solve, then a choice on the choose tab (about a second each)
_EXPLORER_CELLS = (
    """from sapptk import viz
from sapptk.config import PipelineConfig
from sapptk.explorer import Explorer
from sapptk.profile import LayerGroup, ModeCost, Profile

viz.output_notebook()
profile = Profile("uniform", (LayerGroup("layer", "body", 16, 1.0, 1.0, {"none": ModeCost(2.0, 1.0)}),))
explorer = Explorer(profile, PipelineConfig(4, 8, memory_budget=100.0), time_limit=2)
explorer""",
    """assert explorer.solve() is not None, explorer.status_text
chooser = explorer.chooser
chooser.devices.value, chooser.global_batch.value, chooser.time_limit.value = 4, 8, 1
chooser.choose_button.click()
assert chooser.wait(120).best is not None and chooser.figure.children, chooser.status_text""",
)


FIGURE_TABS = ("timeline", "memory & time", "choose")  # the Explorer's tabs that hold a figure
_VISIBLE = ("return Bokeh.index.roots.filter(r => r.model.type !== 'Notifications'"
            " && r.el.getBoundingClientRect().width > 0).length")


def test_every_explorer_tab_fits_its_output_in_jupyterlab(lab, driver):
    """Each tab of the Explorer that holds a figure opened in turn: its figures take the output's width (not their
    minimum), none reaches past it, no tick labels overlap, no legend covers a plot."""
    import nbformat
    from selenium.webdriver.common.by import By

    book = nbformat.v4.new_notebook()
    book.cells = [nbformat.v4.new_code_cell(code) for code in _EXPLORER_CELLS]
    book.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(book, lab.root / "notebooks" / "explorer_tabs.ipynb")
    began = time.monotonic()
    seconds = _run_all(lab, driver, "explorer_tabs.ipynb")
    print(f"explorer_tabs.ipynb: opened in {time.monotonic() - began - seconds:.0f} s, ran in {seconds:.0f} s")
    drawn = {}
    for size in SIZES[:1]:  # the laptop, where the figures stayed at their minimum width (the larger size: above)
        for tab in driver.find_elements(By.CSS_SELECTOR, ".widget-tab .lm-TabBar-tab"):
            if tab.text.strip() not in FIGURE_TABS:
                continue
            driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", tab)
            tab.click()
            drawn[tab.text.strip()] = _wait(lambda: driver.execute_script(_VISIBLE), 30, "the tab's figure", poll=0.2)
            time.sleep(0.5)  # laid out
            lay = driver.execute_script(_LAYOUT)
            for key, what in (("wide", "wider than"), ("narrow", "narrower than"), ("scrolling", "scrolling in"),
                              ("over", "legends over the plot in"), ("ticks", "tick labels that may overlap in")):
                assert not lay[key], f"tab {tab.text!r} at {size}: figures {what} their output: {lay[key]}"
    assert drawn == dict.fromkeys(FIGURE_TABS, 1), drawn
    severe = [e["message"] for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
    assert not severe, severe
