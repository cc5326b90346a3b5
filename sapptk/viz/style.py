"""The look shared by every figure: colours, sizes, tools, number formats.

Colours are handed to Bokeh as palettes indexed by an integer column of the source
(through a :class:`~bokeh.models.LinearColorMapper` centred on the integers), never as a
string per row: sources stay numeric, so they serialise as binary arrays.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from bokeh.models import (
    BoxZoomTool,
    LinearColorMapper,
    NumeralTickFormatter,
    PanTool,
    ResetTool,
    SaveTool,
    WheelZoomTool,
)
from bokeh.palettes import Category10_10, Turbo256

from sapptk.errors import SapptkError

#: Box colour of each op category; later chunks are drawn lighter.
CATEGORY_COLORS: dict[str, str] = {
    "forward": "#3a6ea5",
    "backward": "#d1495b",
    "input-gradient": "#ee8434",
    "weight-gradient": "#3e9b5f",
    "overlapped": "#7b4fa0",
}
CATEGORIES: tuple[str, ...] = tuple(CATEGORY_COLORS)
KIND_CATEGORY: dict[str, int] = {"F": 0, "B": 1, "I": 2, "W": 3}  # op kind -> index into CATEGORIES
OVERLAPPED = 4

BUDGET_COLOR = "#d1495b"
RECOMPUTE_COLOR = "#f2b134"
WIDTH = 1100
ROW_PX = 26
LABEL_PX_PER_CHAR = 7.0
MAX_LABELS = 4000
BACKENDS = ("webgl", "canvas", "svg")


def _hex_to_rgb(color: str) -> np.ndarray:
    color = color.lstrip("#")
    return np.array([int(color[i : i + 2], 16) for i in (0, 2, 4)], dtype=float)


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
    fills = [c for cat in CATEGORIES for c in shades(CATEGORY_COLORS[cat], max(chunks, 1))]
    return fills, [text_color(f) for f in fills]


def device_colors(n: int) -> list[str]:
    """One colour per device: Category10 up to 10 devices, spread over Turbo beyond."""
    if n <= len(Category10_10):
        return list(Category10_10[:n])
    idx = np.linspace(20, 235, n).astype(int)
    return [Turbo256[i] for i in idx]


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


def time_tools(fig: Any) -> None:
    """Pan and wheel-zoom along time, box zoom, reset, save; the wheel zooms at once.
    (Given as objects: Bokeh's parsing of a tool string is a large part of a figure's build.)"""
    wheel = WheelZoomTool(dimensions="width")
    fig.add_tools(PanTool(dimensions="width"), wheel, BoxZoomTool(), ResetTool(), SaveTool())
    fig.toolbar.active_scroll = wheel


def check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise SapptkError(f"backend = {backend!r}: expected one of {', '.join(map(repr, BACKENDS))}")
