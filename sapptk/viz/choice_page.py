"""One standalone HTML page of a choice (:func:`sapptk.choose`): what ``sapptk choose --out`` writes.

:func:`choice_page` lays out, top to bottom: the question and the answer in words
(``Choice.summary()`` and its notes), the first rows of the ranking as a table, the ranking
figure (:func:`~sapptk.viz.choice_plots.choice_ranking`), the Pareto front of step time
against peak memory (:func:`~sapptk.viz.choice_plots.choice_pareto`, when some setup was
balanced) and the winner's timeline with its memory (:func:`~sapptk.viz.timelines.timeline`).
:func:`save_choice_page` writes it with Bokeh's JavaScript inline, so the page works offline.
Nothing in the core imports this module.
"""

from __future__ import annotations

import html
import os
from pathlib import Path
from typing import Any

from bokeh.layouts import column
from bokeh.models import Div, UIElement

from sapptk.errors import SapptkError
from sapptk.viz import look
from sapptk.viz.choice_plots import choice_pareto, choice_ranking
from sapptk.viz.export import save_html
from sapptk.viz.timelines import timeline

__all__ = ["choice_page", "save_choice_page"]

_TABLE_STYLE = ("<style>table.sapptk{border-collapse:collapse;font:13px sans-serif}"
                "table.sapptk td,table.sapptk th{padding:2px 8px;border-bottom:1px solid #ddd;text-align:right}"
                "table.sapptk th{background:#f4f4f4}</style>")
_ROUND = {"step_time_ms": 1, "bound_ms": 1, "peak_mb_max": 0, "tokens_per_s_per_device": 1}


def _check(choice: Any) -> None:
    if not all(hasattr(choice, name) for name in ("frame", "best", "summary", "top")):
        raise SapptkError(f"choice_page: choice = {type(choice).__name__}: expected a sapptk.Choice "
                          "(what sapptk.choose returns)")


def _words(choice: Any, title: str) -> Div:
    lines = html.escape(choice.summary())
    return Div(text=f"<h1 style='font:bold 20px sans-serif'>{html.escape(title)}</h1>"
                    f"<pre style='font:13px monospace;white-space:pre-wrap'>{lines}</pre>",
               sizing_mode="stretch_width")


def _table(choice: Any, top: int) -> Div:
    rows = choice.top(top).round(_ROUND)
    table = rows.to_html(index=False, classes="sapptk", border=0, na_rep="", escape=True)
    return Div(text=f"{_TABLE_STYLE}<h2 style='font:bold 16px sans-serif'>ranking (first {len(rows)} of "
                    f"{len(choice.frame)} setups; all in the CSV)</h2>{table}", sizing_mode="stretch_width")


def choice_page(choice: Any, *, title: str = "sapptk choose", top: int = 20) -> UIElement:
    """The page of ``choice`` as one Bokeh layout (module docstring): ``top`` rows of the ranking
    in the table, up to 30 setups in the ranking figure. Raises
    :class:`~sapptk.errors.SapptkError` for something that is not a choice."""
    _check(choice)
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise SapptkError(f"choice_page: top = {top!r}: expected an integer >= 1")
    parts: list[UIElement] = [_words(choice, title), _table(choice, top), choice_ranking(choice)]
    balanced = choice.frame[(choice.frame["status"] == "balanced") & choice.frame["peak_mb_max"].notna()]
    if not balanced.empty:
        parts.append(choice_pareto(choice))
    if getattr(choice.best, "solved", False):
        parts.append(Div(text="<h2 style='font:bold 16px sans-serif'>the winner's timeline</h2>",
                         sizing_mode="stretch_width"))
        parts.append(timeline(choice.best))
    return look.finish(column(*parts, sizing_mode="stretch_width"))


def save_choice_page(choice: Any, path: str | os.PathLike[str], *, title: str = "sapptk choose",
                     top: int = 20) -> Path:
    """Write :func:`choice_page` to ``path`` as a standalone HTML page (works offline); its path."""
    return save_html(choice_page(choice, title=title, top=top), path, title=title)
