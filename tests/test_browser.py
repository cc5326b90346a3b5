"""A standalone timeline page in a real headless Chromium: no console errors, canvas drawn.

Needs Selenium (the ``export`` extra) and Debian's ``chromium`` + ``chromium-driver``;
skips with the reason where they are missing (CI installs them).
"""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from sapptk import viz
from sapptk.schedules import build
from sapptk.simulation import simulate

WebDriverWait = pytest.importorskip(
    "selenium.webdriver.support.ui", reason="needs selenium: pip install 'sapptk[export]'"
).WebDriverWait
if viz.find_chromium() is None:
    pytest.skip("needs Chromium: apt-get install chromium chromium-driver", allow_module_level=True)

pytestmark = pytest.mark.slow  # a browser start and a page render each: seconds


def decode_png(data: bytes) -> np.ndarray:
    """Pixels of a PNG as an (h, w, channels) uint8 array."""
    with Image.open(io.BytesIO(data)) as img:
        return np.asarray(img.convert("RGBA" if img.mode in ("RGBA", "LA", "P") else "RGB"))


def _rgb(hex_color: str) -> tuple[int, int, int]:
    h = hex_color.lstrip("#")
    return int(h[0:2], 16), int(h[2:4], 16), int(h[4:6], 16)


# ------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def driver():
    drv = viz.chromium_driver(console_log=True, window=(1300, 1100))
    yield drv
    viz.close_driver(drv)


def _open(driver, path):
    from bokeh.io.export import wait_until_render_complete

    driver.get(path.resolve().as_uri())
    wait_until_render_complete(driver, 30)


def _severe(driver):
    return [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]


# --------------------------------------------------------------------- tests
def test_timeline_page_renders_without_console_errors(driver, tmp_path):
    sim = simulate(build("interleaved", stages=4, micro_batches=8, chunks=2), forward=0.5, backward=1.0,
                   activation=5.0, params=25.0)
    page = viz.save_html(viz.timeline(sim, budget=110.0), tmp_path / "timeline.html")
    _open(driver, page)
    errors = _severe(driver)
    assert not errors, errors
    pixels = decode_png(driver.get_screenshot_as_png())[..., :3]
    colors = np.unique(pixels.reshape(-1, 3), axis=0)
    assert len(colors) > 50, f"screenshot looks blank: {len(colors)} distinct colours"
    flat = pixels.reshape(-1, 3)
    for kind in ("forward", "backward"):
        hits = np.all(flat == _rgb(viz.CATEGORY_COLORS[kind]), axis=1).sum()
        assert hits > 500, f"few {kind} pixels ({hits}): boxes not drawn?"
    non_white = np.any(flat < 245, axis=1).mean()
    assert non_white > 0.05


def test_zoom_writes_micro_batches_on_boxes(driver, tmp_path):
    sim = simulate(build("1f1b", stages=4, micro_batches=200), forward=1.0, backward=2.0)
    page = viz.save_html(viz.timeline(sim), tmp_path / "long.html")
    _open(driver, page)
    count = """
        const doc = Bokeh.documents[0]
        return doc.get_model_by_name("labels").view.indices.count
    """
    assert driver.execute_script(count) == 0  # boxes too narrow at full view
    driver.execute_script("""
        const r = Bokeh.documents[0].get_model_by_name("time_range")
        r.setv({start: 100, end: 140})
    """)
    shown = driver.execute_script(count)
    assert 10 < shown < 200, shown
    shown = driver.execute_script("""
        const labels = Bokeh.documents[0].get_model_by_name("labels")
        const data = labels.data_source.data
        return Array.from(labels.view.filter.indices).map(i => [data.label_x[i], data.micro_batch[i]])
    """)
    assert all(100 <= x <= 140 for x, _ in shown)  # only boxes in view are labelled
    assert not _severe(driver)


def test_large_program_page_renders(driver, tmp_path):
    sim = simulate(build("interleaved", stages=16, micro_batches=320, chunks=2), forward=0.5, backward=1.0)
    assert len(sim.events) > 20_000
    page = viz.save_html(viz.timeline(sim), tmp_path / "large.html")
    _open(driver, page)
    assert not _severe(driver)
    pixels = decode_png(driver.get_screenshot_as_png())[..., :3].reshape(-1, 3).astype(int)
    # sub-pixel boxes blend: look for colours near the kinds' colours
    for kind in ("forward", "backward"):
        near = (np.abs(pixels - _rgb(viz.CATEGORY_COLORS[kind])).sum(axis=1) < 60).sum()
        assert near > 300, (kind, near)
    assert np.any(pixels < 245, axis=1).mean() > 0.2


def test_memory_legend_click_dims_one_device(driver, tmp_path):
    sim = simulate(build("1f1b", stages=4, micro_batches=8), forward=1.0, backward=2.0, activation=10.0)
    page = viz.save_html(viz.timeline(sim), tmp_path / "legend.html")
    _open(driver, page)
    click = """
        const {LegendItemClick} = Bokeh.require("core/bokeh_events")
        const legend = Bokeh.documents[0].get_model_by_name("memory-legend")
        legend.trigger_event(new LegendItemClick(legend, legend.items[2]))
    """
    read = """
        const d = Bokeh.documents[0].get_model_by_name("memory").data_source.data
        return [Array.from(d.device), Array.from(d.alpha)]
    """

    def dimmed(drv):  # the callback runs asynchronously: poll until it has
        device, alpha = map(np.asarray, drv.execute_script(read))
        return (alpha < 0.5).any() and (device[alpha < 0.5] == 2).all() and (alpha[device == 2] < 0.5).all()

    driver.execute_script(click)
    WebDriverWait(driver, 10, poll_frequency=0.05).until(dimmed)
    driver.execute_script(click)  # a second click brings it back
    WebDriverWait(driver, 10, poll_frequency=0.05).until(
        lambda drv: (np.asarray(drv.execute_script(read)[1]) == 1).all()
    )
    assert not _severe(driver)


def test_compare_of_plans_renders(driver, tmp_path, llama):
    from sapptk.config import PipelineConfig
    from sapptk.plan import even_split

    config = PipelineConfig(16, 32, chunks=2, schedule="interleaved", memory_budget=56000)
    fig = viz.compare(even_split(llama, config, "full"), even_split(llama, config, "auto"), labels=["a", "b"],
                      memory=True)
    _open(driver, viz.save_html(fig, tmp_path / "compare.html"))
    assert not _severe(driver)
    pixels = decode_png(driver.get_screenshot_as_png())[..., :3].reshape(-1, 3).astype(int)
    near = (np.abs(pixels - _rgb(viz.CATEGORY_COLORS["forward"])).sum(axis=1) < 30).sum()
    assert near > 500, near


def test_export_png_and_svg_each_write_one_file(tmp_path):
    sim = simulate(build("1f1b", stages=4, micro_batches=8), forward=1.0, backward=2.0)
    fig = viz.timeline(sim)
    png = viz.export_png(fig, tmp_path / "t.png")
    assert png == tmp_path / "t.png"
    img = decode_png(png.read_bytes())
    assert img.shape[1] > 800 and len(np.unique(img.reshape(-1, img.shape[2]), axis=0)) > 20
    svg = viz.export_svg(fig, tmp_path / "t.svg")
    assert svg == tmp_path / "t.svg" and sorted(p.name for p in tmp_path.iterdir()) == ["t.png", "t.svg"]
    text = svg.read_text()
    assert text.lstrip().startswith("<svg") and text.count("<svg") == 1
    assert text.count("<path") > len(sim.events) and "memory in use" in text  # the boxes and the pane below
    # exported on the canvas, the figure itself is left as it was
    from bokeh.models import Plot

    assert {p.output_backend for p in fig.select({"type": Plot})} == {"webgl"}
