"""Bokeh figures of plans, simulations and sweeps, built from their DataFrames.

* :func:`timeline` — a Gantt chart of one plan or simulation, memory in use below;
  :func:`compare` — several on one time scale (:mod:`sapptk.viz.timelines`).
* :func:`stage_bars` — per device, memory against the budget and compute time
  (:mod:`sapptk.viz.plan_bars`).
* :func:`step_time_by_budget`, :func:`heatmap`, :func:`pareto`, :func:`pareto_front` —
  a sweep's frame (:mod:`sapptk.viz.sweep_plots`).
* :func:`choice_ranking`, :func:`choice_pareto` — a choice's ranking and Pareto front
  (:mod:`sapptk.viz.choice_plots`); :func:`choice_page`, :func:`save_choice_page` — all of
  it and the winner's timeline on one standalone page (:mod:`sapptk.viz.choice_page`).
* :func:`sensitivity_plot`, :func:`critical_plot`, :func:`validation_plot` — how sure a
  plan is, where its critical path runs, and predicted against measured peaks (:mod:`sapptk.viz.robustness`).
* :func:`save_html`, :func:`export_png`, :func:`export_svg`, :func:`export_pdf` — files (:mod:`sapptk.viz.export`).
* :func:`output_notebook` — BokehJS in a notebook, inline but not saved in the file
  (:mod:`sapptk.viz.jupyter`).
* :func:`style` — ``"notebook"`` (default) or ``"paper"`` (one or two columns) for every
  figure drawn after it.
* :func:`finish` — the style in force applied to a Bokeh layout of your own (the figure
  functions end with it).
* Colours and sizes: :mod:`sapptk.viz.look`; what a figure accepts: :mod:`sapptk.viz.subjects`.

Figures take a :class:`~sapptk.plan.Plan` or a :class:`~sapptk.simulation.Simulation`
alike, and draw the memory budget the subject carries unless told otherwise
(``budget=``). The names load on first use, so drawing a timeline does not load the
sweep machinery. Nothing in the core imports this package.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS: dict[str, str] = {
    "CATEGORY_COLORS": "sapptk.viz.look",
    "style": "sapptk.viz.look",
    "finish": "sapptk.viz.look",
    "timeline": "sapptk.viz.timelines",
    "compare": "sapptk.viz.timelines",
    "op_source": "sapptk.viz.timelines",
    "stage_bars": "sapptk.viz.plan_bars",
    "device_frame": "sapptk.viz.plan_bars",
    "step_time_by_budget": "sapptk.viz.sweep_plots",
    "heatmap": "sapptk.viz.sweep_plots",
    "pareto": "sapptk.viz.sweep_plots",
    "pareto_front": "sapptk.viz.sweep_plots",
    "choice_ranking": "sapptk.viz.choice_plots",
    "choice_pareto": "sapptk.viz.choice_plots",
    "choice_page": "sapptk.viz.choice_page",
    "save_choice_page": "sapptk.viz.choice_page",
    "sensitivity_plot": "sapptk.viz.robustness",
    "critical_plot": "sapptk.viz.robustness",
    "validation_plot": "sapptk.viz.robustness",
    "save_html": "sapptk.viz.export",
    "export_png": "sapptk.viz.export",
    "export_pdf": "sapptk.viz.export",
    "export_svg": "sapptk.viz.export",
    "ExportUnavailableError": "sapptk.viz.export",
    "find_chromium": "sapptk.viz.export",
    "chromium_driver": "sapptk.viz.export",
    "close_driver": "sapptk.viz.export",
    "output_notebook": "sapptk.viz.jupyter",
}

__all__ = [
    "CATEGORY_COLORS",
    "ExportUnavailableError",
    "choice_page",
    "choice_pareto",
    "choice_ranking",
    "chromium_driver",
    "close_driver",
    "compare",
    "critical_plot",
    "device_frame",
    "export_pdf",
    "export_png",
    "export_svg",
    "find_chromium",
    "finish",
    "heatmap",
    "op_source",
    "output_notebook",
    "pareto",
    "pareto_front",
    "save_choice_page",
    "save_html",
    "sensitivity_plot",
    "stage_bars",
    "step_time_by_budget",
    "style",
    "timeline",
    "validation_plot",
]

if TYPE_CHECKING:  # for type checkers and IDEs; at run time the names load lazily
    from sapptk.viz.choice_page import choice_page, save_choice_page
    from sapptk.viz.choice_plots import choice_pareto, choice_ranking
    from sapptk.viz.export import (
        ExportUnavailableError,
        chromium_driver,
        close_driver,
        export_pdf,
        export_png,
        export_svg,
        find_chromium,
        save_html,
    )
    from sapptk.viz.jupyter import output_notebook
    from sapptk.viz.look import CATEGORY_COLORS, finish, style
    from sapptk.viz.plan_bars import device_frame, stage_bars
    from sapptk.viz.robustness import critical_plot, sensitivity_plot, validation_plot
    from sapptk.viz.sweep_plots import heatmap, pareto, pareto_front, step_time_by_budget
    from sapptk.viz.timelines import compare, op_source, timeline


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'sapptk.viz' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
