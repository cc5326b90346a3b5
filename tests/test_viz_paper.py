"""Every figure function in both styles: ``"notebook"`` stretches to the output width with
legends beside the plot; ``"paper"`` has the column width, print fonts, the Okabe–Ito
palette and no toolbar. Then (browser) each one exported as SVG, PNG at a DPI, and PDF, and
the files opened and measured.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import numpy as np
import pandas as pd
import pytest
from bokeh.models import Axis, GridPlot, Legend, Plot, Row, Title

from sapptk import viz
from sapptk.config import PipelineConfig
from sapptk.plan import even_split
from sapptk.viz import look


def _sweep_frame() -> pd.DataFrame:
    """A sweep's frame by hand: two schedules, two chunk counts, three budgets (closed forms)."""
    rows = []
    for schedule in ("1f1b", "interleaved"):
        for chunks in (1, 2):
            for budget in (40000.0, 56000.0, 80000.0):
                step = 1000.0 * (8 + 3) / chunks * (1 + 20000 / budget)
                solved = not (schedule == "1f1b" and chunks == 2)
                rows.append({"profile": "llama2_70b", "schedule": schedule, "stages": 4, "micro_batches": 8,
                             "chunks": chunks, "memory_budget_mb": budget, "recompute": "full",
                             "status": "optimal" if solved else "invalid",
                             "step_time_ms": step if solved else np.nan,
                             "peak_mb_max": budget * 0.9 if solved else np.nan, "bubble_of_compute": 0.3,
                             "gap": 0.0 if solved else np.nan})
    frame = pd.DataFrame(rows)
    for col in ("profile", "schedule", "recompute", "status"):
        frame[col] = frame[col].astype("category")
    return frame


@pytest.fixture(scope="module")
def subjects(llama):
    config = PipelineConfig(4, 8, 2, "interleaved", memory_budget=60000)
    plan = even_split(llama, config, "full")
    return {"plan": plan, "even": even_split(llama, config, "auto"), "sweep": _sweep_frame()}


def _validation_frame() -> pd.DataFrame:
    return pd.DataFrame({"device": [0, 1, 2, 3], "predicted_mb": [52000.0, 48000.0, 47000.0, 50000.0],
                         "observed_mb": [51000.0, 48500.0, 46000.0, 50500.0]})


FIGURES = {
    "timeline": lambda s: viz.timeline(s["plan"]),
    "compare": lambda s: viz.compare(s["plan"], s["even"], labels=["plan", "even"], memory=True),
    "stage_bars": lambda s: viz.stage_bars(s["plan"]),
    "step_time_by_budget": lambda s: viz.step_time_by_budget(s["sweep"]),
    "heatmap": lambda s: viz.heatmap(s["sweep"], "memory_budget_mb", "schedule"),
    "pareto": lambda s: viz.pareto(s["sweep"]),
    "sensitivity_plot": lambda s: viz.sensitivity_plot(s["plan"].sensitivity(samples=100, seed=1)),
    "critical_plot": lambda s: viz.critical_plot(s["plan"]),
    "validation_plot": lambda s: viz.validation_plot(_validation_frame()),
}
# what each figure's SVG must say, besides the fonts and the size
TEXTS = {
    "timeline": ["time (ms)", "memory in use (MB)", "forward"],
    "compare": ["time (ms)", "plan: step time"],
    "stage_bars": ["peak memory per device (MB)", "parameters"],
    "step_time_by_budget": ["memory budget per device (MB)", "step time (ms)", "40,000"],
    "heatmap": ["memory budget per device (MB)", "56,000"],
    "pareto": ["peak memory, fullest device (MB)", "Pareto front"],
    "sensitivity_plot": ["independent"],
    "critical_plot": ["virtual stage"],
    "validation_plot": ["peak memory (MB)", "observed"],
}


def _plots(layout):
    return list(layout.select({"type": Plot}))


def _across(layout) -> int:
    return len(layout.children) if isinstance(layout, Row) else 1


@pytest.mark.parametrize("name", FIGURES)
def test_notebook_style_stretches_with_legends_beside(subjects, name):
    fig = FIGURES[name](subjects)
    assert look.current().name == "notebook"
    assert fig.sizing_mode == "stretch_width"
    for plot in _plots(fig):
        assert plot.sizing_mode == "stretch_width" and plot.min_width >= 240
        assert not [r for r in plot.center if isinstance(r, Legend)], "a legend inside the plot area"
        for legend in plot.select({"type": Legend}):
            assert legend.click_policy == "hide" or legend.js_event_callbacks  # click to hide (or dim)
        for axis in plot.select({"type": Axis}):
            assert type(axis.formatter).__name__ != "BasicTickFormatter", (name, axis)  # separators
        assert plot.toolbar.logo is None


@pytest.mark.parametrize("columns", [1, 2])
@pytest.mark.parametrize("name", FIGURES)
def test_paper_style_sizes_fonts_palette_and_no_toolbar(subjects, name, columns):
    with viz.style("paper", columns=columns) as st:
        fig = FIGURES[name](subjects)
        assert st.width == round(look.PAPER_WIDTH_IN[columns] * 96)
    assert look.current().name == "notebook"  # the block put the previous style back
    plots = _plots(fig)
    for plot in plots:
        assert plot.sizing_mode is None and plot.width == st.width // _across(fig)
        assert plot.toolbar_location is None
        for axis in plot.select({"type": Axis}):
            assert axis.major_label_text_font_size == "10.7px" and axis.axis_label_text_font_size == "12.0px"
            assert axis.major_label_text_font == look.PAPER_FONT
        for title in plot.select({"type": Title}):
            assert title.text_font_size == "12.0px"
    for grid in [fig, *fig.select({"type": GridPlot})]:
        if isinstance(grid, GridPlot):
            assert grid.toolbar_location is None
    colours = {c.upper() for c in re.findall(r"#[0-9a-fA-F]{6}", _colours(fig))}
    from bokeh.palettes import Cividis256

    safe = {c.upper() for c in (*look.OKABE_ITO, *Cividis256)}  # categories; values (the heatmap)
    assert colours & safe, f"{name}: no Okabe–Ito or Cividis colour in {sorted(colours)[:8]}"
    assert not colours & {c.upper() for c in look.CATEGORY_COLORS.values()} - {c.upper() for c in look.OKABE_ITO}


def _colours(layout) -> str:
    """Every colour a layout's glyphs and mappers name, as one string."""
    from bokeh.models import ColorMapper, GlyphRenderer

    out = []
    for mapper in layout.select({"type": ColorMapper}):
        out += [str(c) for c in mapper.palette]
    for renderer in layout.select({"type": GlyphRenderer}):
        glyph = renderer.glyph
        for prop in ("fill_color", "line_color", "color"):
            value = getattr(glyph, prop, None)
            if isinstance(value, str):
                out.append(value)
        source = renderer.data_source
        for col in ("color", "fill_color"):
            if col in source.data:
                out += [str(c) for c in source.data[col]]
    return " ".join(out)


def test_style_checks_its_arguments():
    from sapptk.errors import SapptkError

    with pytest.raises(SapptkError, match="style = 'poster'"):
        viz.style("poster")
    with pytest.raises(SapptkError, match="columns = 3"):
        viz.style("paper", columns=3)
    assert look.current().name == "notebook"


# ------------------------------------------------------------------ export (browser)
@pytest.fixture(scope="module")
def driver():
    pytest.importorskip("selenium", reason="needs selenium: pip install 'sapptk[export]'")
    if viz.find_chromium() is None:
        pytest.skip("needs Chromium: apt-get install chromium chromium-driver")
    drv = viz.chromium_driver()
    yield drv
    viz.close_driver(drv)


def _svg_size(root) -> tuple[float, float]:
    return float(root.get("width").removesuffix("px")), float(root.get("height").removesuffix("px"))


@pytest.mark.slow
@pytest.mark.parametrize("name", FIGURES)
def test_paper_svg_of_every_figure_has_its_text_size_and_fonts(subjects, driver, tmp_path, name):
    with viz.style("paper", columns=2):
        fig = FIGURES[name](subjects)
    svg = viz.export_svg(fig, tmp_path / f"{name}.svg", driver=driver)
    root = ET.fromstring(svg.read_text(encoding="utf-8"))
    width, height = _svg_size(root)
    assert width == pytest.approx(round(7.0 * 96), abs=2), width  # two columns: 7 inches
    assert 100 < height < 3000
    text = " ".join(t for t in root.itertext())
    for expected in TEXTS[name]:
        assert expected in text, f"{name}: {expected!r} not in the SVG's text"
    raw = svg.read_text(encoding="utf-8")
    assert "10.7px" in raw and "Helvetica" in raw  # the paper fonts reached the file


@pytest.mark.slow
def test_png_at_a_dpi_and_a_vector_pdf(subjects, driver, tmp_path):
    from PIL import Image

    with viz.style("paper", columns=1):
        fig = viz.timeline(subjects["plan"])
    png = viz.export_png(fig, tmp_path / "t.png", dpi=300, driver=driver)
    with Image.open(png) as img:
        assert img.width == pytest.approx(336 * 300 / 96, abs=4), img.size
        assert tuple(round(d) for d in img.info["dpi"]) == (300, 300)
    svg = viz.export_svg(fig, tmp_path / "t.svg", driver=driver)
    width, height = _svg_size(ET.fromstring(svg.read_text(encoding="utf-8")))
    pdf = viz.export_pdf(fig, tmp_path / "t.pdf", driver=driver)
    data = pdf.read_bytes()
    assert data.startswith(b"%PDF")
    assert data.count(b"/Type /Page") - data.count(b"/Type /Pages") == 1  # one page
    box = re.search(rb"/MediaBox \[\s*0 0 ([0-9.]+) ([0-9.]+)\s*\]", data)
    assert box is not None
    assert float(box.group(1)) == pytest.approx(width * 72 / 96, abs=2)  # points = px * 72 / 96
    assert float(box.group(2)) == pytest.approx(height * 72 / 96, abs=2)
    # vector: the only pictures are the legend swatches, which Bokeh's SVG embeds as small bitmaps
    widths = [int(w) for w in re.findall(rb"/Subtype\s*/Image[^>]*?/Width\s+(\d+)", data)]
    widths += [int(w) for w in re.findall(rb"/Width\s+(\d+)[^>]*?/Subtype\s*/Image", data)]
    assert all(w <= 64 for w in widths), widths
    with pytest.raises(Exception, match="dpi"):
        viz.export_png(fig, tmp_path / "bad.png", dpi=0, driver=driver)


def test_png_dpi_is_checked(tmp_path):
    from bokeh.plotting import figure

    from sapptk.errors import SapptkError

    for bad in (0, 5000, "300", True):
        with pytest.raises(SapptkError, match="dpi"):
            viz.export_png(figure(), tmp_path / "x.png", dpi=bad)


def test_the_gallery_shows_every_figure_function():
    """docs/figures.md shows an image of every figure function (scripts/make_gallery.py)."""
    from pathlib import Path

    docs = Path(__file__).resolve().parents[1] / "docs"
    page = (docs / "figures.md").read_text(encoding="utf-8")
    for name in FIGURES:
        assert f"](figures/{name}.png)" in page, name
        image = docs / "figures" / f"{name}.png"
        assert image.is_file() and image.stat().st_size > 5000, image
    script = (docs.parent / "scripts" / "make_gallery.py").read_text(encoding="utf-8")
    assert all(f'"{name}"' in script for name in FIGURES)
