"""The Explorer's "choose" tab: which pipeline setup to run, from the Explorer's profile.

:class:`ChoosePanel` holds the controls (devices, global batch, micro-batch size, time
limit per setup, Choose), runs :func:`sapptk.choose` on a background thread with the
Explorer's profile, memory budget and recompute modes, and shows the summary, the top
setups and the ranking figure. "Use the winner" sets the Explorer's schedule, stages,
micro-batches and chunks to the winner's, ready to Solve. Tests drive it without a kernel:
set ``.value``, call ``.click()``, then :meth:`ChoosePanel.wait`.
"""

from __future__ import annotations

import html
import threading
from typing import Any

import ipywidgets as w

from sapptk.errors import SapptkError

__all__ = ["ChoosePanel"]

_DESC = {"description_width": "150px"}


class ChoosePanel:
    """The choose tab of an :class:`~sapptk.explorer.Explorer` (``explorer``: anything with
    ``profile``, ``budget``, ``recompute``, ``schedule``, ``stages``, ``micro_batches`` and
    ``chunks`` widgets). ``choice`` holds the last :class:`~sapptk.Choice`."""

    def __init__(self, explorer: Any) -> None:
        self.explorer = explorer
        self.choice: Any = None
        self.devices = w.BoundedIntText(value=16, min=1, max=1_000_000, description="devices", style=_DESC)
        self.global_batch = w.BoundedIntText(value=64, min=1, max=100_000_000, description="global batch",
                                             style=_DESC)
        self.micro_batch_size = w.BoundedIntText(value=1, min=1, max=1_000_000, description="micro-batch size",
                                                 style=_DESC)
        self.time_limit = w.BoundedIntText(value=5, min=1, max=600, description="time limit per setup (s)",
                                           style=_DESC)
        self.choose_button = w.Button(description="Choose", button_style="primary", icon="search")
        self.use_button = w.Button(description="Use the winner", icon="check", disabled=True,
                                   tooltip="set the Explorer's schedule, stages, micro-batches and chunks to it")
        self.status = w.HTML()
        self.table = w.HTML()
        self.figure = w.Box()
        self._thread: threading.Thread | None = None
        self.widget = w.VBox([
            w.HTML("Rank every schedule × stages × chunks for the devices and global batch, with the Explorer's "
                   "profile, memory budget and recompute modes; setups that cannot win are pruned by proven bounds."),
            self.devices, self.global_batch, self.micro_batch_size, self.time_limit,
            w.HBox([self.choose_button, self.use_button]), self.status, self.table, self.figure,
        ])
        self.choose_button.on_click(lambda _b: self.start())
        self.use_button.on_click(lambda _b: self.use_winner())

    def start(self) -> None:
        """Run the choice on a background thread (the button is disabled meanwhile)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self.choose_button.disabled = True
        self.use_button.disabled = True
        self.status.value = "choosing…"
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def wait(self, timeout: float | None = None) -> Any:
        """Wait for the running choice; returns the :class:`~sapptk.Choice` (or None)."""
        if self._thread is not None:
            self._thread.join(timeout)
        return self.choice

    def _run(self) -> None:
        from sapptk.choosing import choose

        ex = self.explorer
        budget = float(ex.budget.value) or None
        modes = tuple(m for m, box in ex.recompute.items() if box.value)
        try:
            choice = choose(ex.profile, devices=int(self.devices.value), global_batch=int(self.global_batch.value),
                            micro_batch_size=int(self.micro_batch_size.value), memory_budget=budget,
                            recompute=modes or None, time_limit=float(self.time_limit.value))
        except SapptkError as exc:
            self.status.value = f"<b>cannot choose:</b> {html.escape(str(exc))}"
        else:
            self.choice = choice
            self.status.value = "<br>".join(html.escape(line) for line in choice.summary().splitlines())
            self.table.value = choice.top(10).to_html(index=False, float_format=lambda x: f"{x:,.1f}")
            from jupyter_bokeh.widgets import BokehModel

            from sapptk import viz

            self.figure.children = (BokehModel(viz.choice_ranking(choice, top=15)),)
            self.use_button.disabled = False
        finally:
            self.choose_button.disabled = False

    def use_winner(self) -> None:
        """Set the Explorer's controls to the winner's setup."""
        if self.choice is None:
            return
        cfg = self.choice.best.config
        ex = self.explorer
        ex.schedule.value = cfg.schedule
        ex.stages.value = cfg.stages
        ex.micro_batches.value = cfg.micro_batches
        ex.chunks.value = cfg.chunks
