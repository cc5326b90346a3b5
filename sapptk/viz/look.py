"""The look shared by every figure: colours, sizes, tools, number formats, and the two
styles (:func:`style`): ``"notebook"`` (figures stretch to the output width, toolbars,
legends beside the plot, click to hide) and ``"paper"`` (a one- or two-column width, print
fonts, the Okabe–Ito colour-blind-safe palette, no toolbar). Every figure function ends
with :func:`finish`, which applies the style in force to the whole layout.

Colours are handed to Bokeh as palettes indexed by an integer column of the source
(through a :class:`~bokeh.models.LinearColorMapper` centred on the integers), never as a
string per row: sources stay numeric, so they serialise as binary arrays.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import numpy as np
from bokeh.models import (
    Axis,
    BasicTickFormatter,
    BoxZoomTool,
    CategoricalAxis,
    ColorBar,
    GridPlot,
    Label,
    LayoutDOM,
    Legend,
    LinearColorMapper,
    NoOverlap,
    NumeralTickFormatter,
    PanTool,
    Plot,
    ResetTool,
    SaveTool,
    Title,
    WheelZoomTool,
)
from bokeh.palettes import Category10_10, Turbo256

from sapptk import checks
from sapptk.errors import SapptkError

#: Box colour of each op category (notebook style); later chunks are drawn lighter.
CATEGORY_COLORS: dict[str, str] = {
    "forward": "#3a6ea5",
    "backward": "#d1495b",
    "input-gradient": "#ee8434",
    "weight-gradient": "#3e9b5f",
    "overlapped": "#7b4fa0",
}
#: Okabe & Ito's colour-blind-safe palette (black left out), the paper style's colours.
OKABE_ITO: tuple[str, ...] = ("#0072B2", "#D55E00", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#F0E442")
PAPER_CATEGORY_COLORS: dict[str, str] = dict(zip(CATEGORY_COLORS, OKABE_ITO, strict=False))
CATEGORIES: tuple[str, ...] = tuple(CATEGORY_COLORS)
KIND_CATEGORY: dict[str, int] = {"F": 0, "B": 1, "I": 2, "W": 3}  # op kind -> index into CATEGORIES
OVERLAPPED = 4

BUDGET_COLOR = "#d1495b"
RECOMPUTE_COLOR = "#f2b134"
WIDTH = 1100  # px: the width a stretching figure assumes before the browser lays it out
MIN_WIDTH = 480  # px: below it a stretching figure scrolls instead of squeezing
ROW_PX = 26
LABEL_PX_PER_CHAR = 7.0
MAX_LABELS = checks.MAX_LABELS
BACKENDS = ("webgl", "canvas", "svg")


def _hex_to_rgb(color: str) -> np.ndarray:
    color = color.lstrip("#")
    return np.array([int(color[i : i + 2], 16) for i in (0, 2, 4)], dtype=float)


STYLES = ("notebook", "paper")
PX_PER_INCH = 96  # CSS pixels; an SVG's width in px / 96 is its width in inches
PAPER_WIDTH_IN = {1: 3.5, 2: 7.0}  # a one- and a two-column figure (inches)
PAPER_FONT = "Helvetica, Arial, sans-serif"
PAPER_FONT_PT = 8  # tick and legend labels; axis labels and titles one point more


@dataclass(frozen=True)
class Style:
    """The style in force: its name and, for ``"paper"``, the columns a figure spans."""

    name: str = "notebook"
    columns: int = 2
    previous: Style | None = field(default=None, repr=False, compare=False)  # put back by ``with``

    @property
    def paper(self) -> bool:
        return self.name == "paper"

    @property
    def width(self) -> int:
        """Paper: the figure width in px; notebook: the width assumed before layout."""
        return round(PAPER_WIDTH_IN[self.columns] * PX_PER_INCH) if self.paper else WIDTH

    def font(self, points: float) -> str:
        """A font size (``points`` at print size) as Bokeh wants it."""
        return f"{points * PX_PER_INCH / 72:.1f}px"

    def __enter__(self) -> Style:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        _STATE[0] = self.previous if self.previous is not None else Style()


_STATE: list[Style] = [Style()]


def current() -> Style:
    """The style figures are drawn in now."""
    return _STATE[0]


def style(name: str = "notebook", *, columns: int = 2) -> Style:
    """Draw every figure from now on in ``name``: ``"notebook"`` (the default: figures
    stretch to the output width, with toolbars and click-to-hide legends beside the plot)
    or ``"paper"`` (``columns`` 1 or 2: 3.5 or 7 inches wide, 8-point Helvetica, the
    Okabe–Ito colour-blind-safe palette, no toolbar), for export with
    :func:`~sapptk.viz.export_svg` / :func:`~sapptk.viz.export_png`.

    Returns the new style; used as a context manager (``with viz.style("paper"): ...``) it
    puts the previous one back at the end of the block.
    """
    if name not in STYLES:
        raise SapptkError(f"style = {name!r}: expected one of {', '.join(map(repr, STYLES))}")
    if columns not in PAPER_WIDTH_IN or isinstance(columns, bool):
        raise SapptkError(f"style: columns = {columns!r}: expected 1 or 2 (a one- or a two-column figure)")
    new = Style(name, columns, previous=_STATE[0])
    _STATE[0] = new
    return new


def sequential_palette() -> list[str]:
    """256 colours for values (heatmaps): Viridis; the paper style: Cividis, made for
    colour-vision deficiency."""
    from bokeh.palettes import Cividis256, Viridis256

    return list(Cividis256 if current().paper else Viridis256)


def budget_color() -> str:
    """The memory budget's line and marks."""
    return "#000000" if current().paper else BUDGET_COLOR


def recompute_color() -> str:
    """The recompute share of a backward."""
    return OKABE_ITO[2] if current().paper else RECOMPUTE_COLOR


def category_colors() -> dict[str, str]:
    """The colour of each op category in the style in force."""
    return PAPER_CATEGORY_COLORS if current().paper else CATEGORY_COLORS


def series_colors(n: int) -> list[str]:
    """``n`` colours for lines or bars of different series (schedules, devices, parts)."""
    if current().paper:
        return list(OKABE_ITO[:n]) if n <= len(OKABE_ITO) else _cividis(n)
    return device_colors(n)


def shades(color: str, n: int) -> list[str]:
    """``n`` shades of ``color``: the colour itself, then lighter towards white."""
    rgb = _hex_to_rgb(color)
    out = []
    for c in range(n):
        t = 0.0 if n == 1 else 0.6 * c / (n - 1)
        mixed = np.rint(rgb + (255.0 - rgb) * t).astype(int)
        out.append("#{:02x}{:02x}{:02x}".format(*mixed))
    return out


def text_color(fill: str) -> str:
    """White on dark fills, near-black on light ones."""
    r, g, b = _hex_to_rgb(fill)
    return "#1a1a1a" if 0.299 * r + 0.587 * g + 0.114 * b > 150 else "#ffffff"


def op_palettes(chunks: int) -> tuple[list[str], list[str]]:
    """Box fills and text colours indexed by ``category * chunks + chunk``."""
    colors = category_colors()
    fills = [c for cat in CATEGORIES for c in shades(colors[cat], max(chunks, 1))]
    return fills, [text_color(f) for f in fills]


def device_colors(n: int) -> list[str]:
    """One colour per device: Category10 up to 10 devices, spread over Turbo beyond (the
    paper style: Okabe–Ito, then Cividis)."""
    if current().paper:
        return series_colors(n)
    if n <= len(Category10_10):
        return list(Category10_10[:n])
    idx = np.linspace(20, 235, n).astype(int)
    return [Turbo256[i] for i in idx]


def _cividis(n: int) -> list[str]:
    from bokeh.palettes import Cividis256

    return [Cividis256[i] for i in np.linspace(0, 230, n).astype(int)]


def indexed(palette: list[str]) -> LinearColorMapper:
    """A colour mapper that sends the integer ``i`` to ``palette[i]``."""
    return LinearColorMapper(palette=palette, low=-0.5, high=len(palette) - 0.5)


def fmt_ms(value: float) -> str:
    if value >= 1000:
        return f"{value:,.0f} ms"
    return f"{value:,.1f} ms" if value >= 10 else f"{value:.3g} ms"


def thousands() -> NumeralTickFormatter:
    """A fresh tick formatter with thousands separators (a Bokeh model belongs to one
    document, so figures never share one)."""
    return NumeralTickFormatter(format="0,0")


def time_axis(fig: Any) -> None:
    """Milliseconds with thousands separators on the x axis."""
    fig.xaxis.formatter = NumeralTickFormatter(format="0,0.[000]")


def number_axes(fig: Any, *, x: bool = True) -> None:
    """Thousands separators instead of exponents on the value axes."""
    fig.yaxis.formatter = thousands()
    if x:
        fig.xaxis.formatter = thousands()


def legend_outside(fig: Any, *, hide: bool = True) -> None:
    """Move the legends drawn inside ``fig``'s plot area to its right side (so they never
    cover data); ``hide``: a click on an entry hides its glyphs, unless the legend has its
    own click behaviour."""
    for legend in [r for r in fig.center if isinstance(r, Legend)]:
        fig.center = [r for r in fig.center if r is not legend]
        legend.location = "top_left"
        fig.add_layout(legend, "right")
    for legend in fig.select({"type": Legend}):
        if hide and legend.click_policy == "none" and not legend.js_event_callbacks:
            legend.click_policy = "hide"


def finish(layout: LayoutDOM, *, width: int | None = None) -> LayoutDOM:
    """Apply the style in force to every plot of ``layout`` (a figure, a row, a grid) and
    return it. ``width``: None stretches to the output width (at least :data:`MIN_WIDTH`;
    notebook style) or takes the paper width; a number fixes the whole layout's width.

    Always: legends outside the plot area, thousands separators on numeric axes that still
    have Bokeh's default formatter, numeric tick labels that would overlap left out. Paper: fonts, no toolbar, no logo.
    """
    st = current()
    plots = list(layout.select({"type": Plot}))
    across = _plots_across(layout, plots)
    for fig in plots:
        legend_outside(fig)
        for axis in fig.select({"type": Axis}):
            if not isinstance(axis, CategoricalAxis) and type(axis.formatter) is BasicTickFormatter:
                axis.formatter = NumeralTickFormatter(format="0,0.[00]")
            if not isinstance(axis, CategoricalAxis):  # a narrow figure skips labels rather than overlapping them
                axis.major_label_policy = NoOverlap()
        fig.toolbar.logo = None
    target = width if width is not None else (st.width if st.paper else None)
    if target is None:
        for item in [layout, *layout.select({"type": LayoutDOM})]:
            if isinstance(item, Plot) or item is layout or isinstance(item, GridPlot):
                item.sizing_mode = "stretch_width"
                if isinstance(item, Plot):
                    item.min_width = max(MIN_WIDTH // across, 240)
                    item.width_policy = "max"
    else:
        for fig in plots:  # Bokeh's default sizing: the width given, the height of the frame_height given
            fig.sizing_mode = None
            fig.width = max(int(target) // across, 120)
    if st.paper:
        _paper(layout, plots)
    return layout


def _plots_across(layout: LayoutDOM, plots: list[Plot]) -> int:
    """How many plots sit side by side in ``layout`` (a row of two: 2; a stack: 1)."""
    from bokeh.models import Row

    if isinstance(layout, Row):
        return max(len([c for c in layout.children if isinstance(c, LayoutDOM)]), 1)
    return 1


def _paper(layout: LayoutDOM, plots: list[Plot]) -> None:
    st = current()
    small, large = st.font(PAPER_FONT_PT), st.font(PAPER_FONT_PT + 1)
    for fig in plots:
        fig.toolbar_location = None
        fig.background_fill_color = "white"
        fig.border_fill_color = "white"
        fig.outline_line_color = "#444444"
        for axis in fig.select({"type": Axis}):
            axis.major_label_text_font = axis.axis_label_text_font = PAPER_FONT
            axis.major_label_text_font_size = small
            axis.axis_label_text_font_size = large
            axis.axis_label_text_font_style = "normal"
        for title in fig.select({"type": Title}):
            title.text_font = PAPER_FONT
            title.text_font_size = large
            title.text_font_style = "normal"
        for legend in fig.select({"type": Legend}):
            legend.label_text_font = legend.title_text_font = PAPER_FONT
            legend.label_text_font_size = legend.title_text_font_size = small
            legend.border_line_color = None
        for label in fig.select({"type": Label}):  # headers, budget labels
            label.text_font = PAPER_FONT
            label.text_font_size = small
        for bar in fig.select({"type": ColorBar}):
            bar.major_label_text_font_size = bar.title_text_font_size = small
    if isinstance(layout, GridPlot):
        layout.toolbar_location = None
    for grid in layout.select({"type": GridPlot}):
        grid.toolbar_location = None


def time_tools(fig: Any) -> None:
    """Pan and wheel-zoom along time, box zoom, reset, save; the wheel zooms at once.
    (Given as objects: Bokeh's parsing of a tool string is a large part of a figure's build.)"""
    wheel = WheelZoomTool(dimensions="width")
    fig.add_tools(PanTool(dimensions="width"), wheel, BoxZoomTool(), ResetTool(), SaveTool())
    fig.toolbar.active_scroll = wheel


def check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise SapptkError(f"backend = {backend!r}: expected one of {', '.join(map(repr, BACKENDS))}")
