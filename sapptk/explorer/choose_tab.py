"""The Explorer's "choose" tab: which pipeline setup to run, from the Explorer's profile.

:class:`ChoosePanel` holds the controls (devices, global batch, micro-batch size, time
limit per setup; Choose, Cancel, "Use the winner"), runs :func:`sapptk.choose` on a
background thread with the Explorer's profile, memory budget and recompute modes, shows its
progress while it runs (setups decided of all, balanced, pruned, seconds elapsed) and then
the summary, the top setups and the ranking figure. Cancel, or Kernel → Interrupt while the
kernel is idle, sets the choice's stop event: it ends within about a second and the setups
decided so far stay ranked (the others are ``undecided``). "Use the winner" sets the
Explorer's schedule, stages, micro-batches and chunks to the winner's, ready to Solve.
Tests drive it without a kernel: set ``.value``, call ``.click()``, then
:meth:`ChoosePanel.wait`.
"""

from __future__ import annotations

import html
import threading
import time
from typing import Any

import ipywidgets as w
import pandas as pd

from sapptk.errors import SapptkError
from sapptk.explorer.inputs import HOOK
from sapptk.explorer.tabs import bokeh_widget, error_text

__all__ = ["ChoosePanel", "choice_table", "progress_text"]

_DESC = {"description_width": "150px"}
_TICK_S = 0.5  # how often the elapsed time of a running choice is refreshed
_POLL_S = 0.05  # wait() joins in slices so that a kernel interrupt is seen at once


def _mb_text(x: float) -> str:
    return "" if x != x else f"{x:,.0f}"


def _ms_text(x: float) -> str:
    return "" if x != x else f"{x:,.1f}"


def _rate_text(x: float) -> str:
    return "" if x != x else f"{x:.3g}"


def progress_text(counts: dict[str, Any], elapsed: float) -> str:
    """``"decided 5 of 24 setups (2 balanced, 3 pruned) · 12.3 s"``: a running choice's progress."""
    if not counts:
        return f"bounding the setups… · {elapsed:.1f} s"
    other = counts.get("decided", 0) - counts.get("balanced", 0) - counts.get("pruned", 0)
    more = f", {other} infeasible or invalid" if other > 0 else ""
    return (f"decided {counts.get('decided', 0)} of {counts.get('total', 0)} setups ({counts.get('balanced', 0)} "
            f"balanced, {counts.get('pruned', 0)} pruned{more}) · {elapsed:.1f} s")


def choice_table(choice: Any, n: int = 10) -> pd.DataFrame:
    """The first ``n`` rows of a choice's ranking for display: columns with no value in any row
    left out (``tokens_per_s_per_device`` without a sequence length), times to 0.1 ms, MB to
    whole MB, rates to three significant digits."""
    frame = choice.top(n)
    frame = frame.loc[:, [c for c in frame.columns if frame[c].notna().any()]].copy()
    for col in frame.columns:
        if col.endswith("_ms"):
            frame[col] = frame[col].round(1)
        elif col.endswith("_mb") or col.endswith("_mb_max"):
            frame[col] = frame[col].round(0)
    return frame


class ChoosePanel:
    """The choose tab of an :class:`~sapptk.explorer.Explorer` (``explorer``: anything with
    ``profile``, ``budget``, ``recompute``, ``schedule``, ``stages``, ``micro_batches`` and
    ``chunks`` widgets). ``choice`` holds the last :class:`~sapptk.Choice` (a partial one
    when the choice was stopped); ``progress`` (an HTML line) its progress while it runs;
    ``status_text`` the status as plain text."""

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
        self.cancel_button = w.Button(description="Cancel", icon="stop", disabled=True,
                                      tooltip="stop the choice: the setups decided so far stay ranked")
        self.use_button = w.Button(description="Use the winner", icon="check", disabled=True,
                                   tooltip="set the Explorer's schedule, stages, micro-batches and chunks to it")
        self.status = w.HTML()
        self.progress = w.HTML()
        self.table = w.HTML()
        self.figure = w.VBox(layout=w.Layout(width="100%"))
        self._status_text = ""
        self._thread: threading.Thread | None = None
        self._stop: threading.Event | None = None
        self._why: str | None = None  # what stopped the running choice ("Cancel", "Kernel → Interrupt")
        self._counts: dict[str, Any] = {}
        self._began = 0.0
        self._run = 0
        self._lock = threading.Lock()
        self.widget = w.VBox([
            w.HTML("Rank every schedule × stages × chunks for the devices and global batch, with the Explorer's "
                   "profile, memory budget and recompute modes; setups that cannot win are pruned by proven bounds."),
            self.devices, self.global_batch, self.micro_batch_size, self.time_limit,
            w.HBox([self.choose_button, self.cancel_button, self.use_button]), self.status, self.progress,
            self.table, self.figure,
        ], layout=w.Layout(width="100%"))
        self.choose_button.on_click(lambda _b: self.start())
        self.cancel_button.on_click(lambda _b: self.cancel())
        self.use_button.on_click(lambda _b: self.use_winner())

    # ----------------------------------------------------------------- state
    @property
    def busy(self) -> bool:
        """Whether a choice is running."""
        thread = self._thread
        return thread is not None and thread.is_alive()

    @property
    def status_text(self) -> str:
        """The status line as plain text (``"choosing…"``, the summary, ``"stopped by Cancel: ..."``)."""
        return self._status_text

    def _set_status(self, text: str, *, bold: str | None = None) -> None:
        self._status_text = f"{bold} {text}" if bold else text
        body = "<br>".join(html.escape(line) for line in text.splitlines())
        self.status.value = f"<b>{html.escape(bold)}</b> {body}" if bold else body

    # ------------------------------------------------------------------- run
    def start(self) -> bool:
        """Run the choice on a background thread (what Choose does); False when one is running."""
        with self._lock:
            if self.busy:
                return False
            self._run += 1
            run = self._run
            self._stop = threading.Event()
            self._why = None
            self._counts = {}
            self._began = time.monotonic()
            self.choose_button.disabled = True
            self.use_button.disabled = True
            self.cancel_button.disabled = False
            HOOK.add(id(self), lambda: self._on_interrupt(run))
            how = "Cancel or Kernel → Interrupt stops it" if HOOK.install() else "Cancel stops it"
            self._set_status(f"choosing… ({how}; the setups decided by then stay ranked)")
            self.progress.value = html.escape(progress_text({}, 0.0))
            self._thread = threading.Thread(target=self._work, args=(run, self._stop), daemon=True,
                                            name="sapptk-explorer-choose")
            self._thread.start()
            return True

    def cancel(self, why: str = "Cancel") -> None:
        """Stop the running choice (what Cancel does): it ends within about a second and shows
        the setups decided so far."""
        stop = self._stop
        if self.busy and stop is not None and not stop.is_set():
            self._why = why
            stop.set()
            self.cancel_button.disabled = True
            self._set_status(f"stopping the choice ({why}); the setups decided so far stay ranked…")

    def _on_interrupt(self, run: int) -> None:
        """Kernel → Interrupt while choice ``run`` goes on in the background: as Cancel (runs in
        the SIGINT handler on the main thread: takes no lock)."""
        if run == self._run and self.busy:
            self.cancel("Kernel → Interrupt")

    def wait(self, timeout: float | None = None) -> Any:
        """Wait for the running choice (at most ``timeout`` s); returns :attr:`choice`. A kernel
        interrupt while waiting stops the choice (its partial ranking is shown) and is raised
        again."""
        thread = self._thread
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while thread is not None and thread.is_alive():
                left = _POLL_S if deadline is None else min(_POLL_S, deadline - time.monotonic())
                if left <= 0:
                    break
                thread.join(left)
        except KeyboardInterrupt:
            self.cancel("Kernel → Interrupt")
            raise
        return self.choice

    def _on_progress(self, run: int, counts: dict[str, Any]) -> None:
        """Show choice ``run``'s progress (``choose``'s ``on_progress``; also the ticker's)."""
        if run == self._run:
            self._counts = dict(counts)
            self.progress.value = html.escape(progress_text(self._counts, time.monotonic() - self._began))

    def _tick(self, run: int, done: threading.Event) -> None:
        """Refresh the elapsed time while a setup takes long to decide."""
        while not done.wait(_TICK_S):
            self._on_progress(run, self._counts)

    def _work(self, run: int, stop: threading.Event) -> None:
        """The background thread: choose, then show; always leaves the buttons usable."""
        from sapptk.choosing import choose

        done = threading.Event()
        threading.Thread(target=self._tick, args=(run, done), daemon=True, name="sapptk-explorer-choose-tick").start()
        ex = self.explorer
        try:
            budget = float(ex.budget.value) or None
            modes = tuple(m for m, box in ex.recompute.items() if box.value)
            choice = choose(ex.profile, devices=int(self.devices.value), global_batch=int(self.global_batch.value),
                            micro_batch_size=int(self.micro_batch_size.value), memory_budget=budget,
                            recompute=modes or None, setup_time_limit=float(self.time_limit.value), stop=stop,
                            on_progress=lambda counts: self._on_progress(run, counts))
            done.set()
            self._show(choice)
        except SapptkError as exc:
            self._set_status(str(exc), bold="cannot choose:")
        except KeyboardInterrupt:  # a SIGINT that reached this thread: the choice is lost, the kernel lives
            self._set_status("the choice was interrupted (KeyboardInterrupt) before it could return its ranking; "
                             "press Choose to run it again", bold="interrupted:")
        except BaseException as exc:  # the status line says it; the thread never dies silently
            self._set_status(error_text(exc), bold="error:")
        finally:
            done.set()
            with self._lock:
                if run == self._run:
                    HOOK.remove(id(self))
                    self.choose_button.disabled = False
                    self.cancel_button.disabled = True
            self._on_progress(run, self._counts)

    def _show(self, choice: Any) -> None:
        """Put a finished (or stopped) choice in the tab: summary and top rows at once, then
        the ranking figure."""
        self.choice = choice
        summary = choice.summary()
        if choice.status == "stopped":
            self._set_status(summary, bold=f"stopped by {self._why or 'the stop event'}:")
        else:
            self._set_status(summary)
        table = choice_table(choice)
        formats = {c: (_mb_text if c.endswith(("_mb", "_mb_max")) else _ms_text if c.endswith("_ms") else _rate_text)
                   for c in table.columns if pd.api.types.is_float_dtype(table[c])}
        self.table.value = table.to_html(index=False, border=0, na_rep="", formatters=formats)
        self.use_button.disabled = choice.best is None
        timed = choice.frame["status"].isin(["balanced", "pruned", "unsolved"])
        if timed.any() and (choice.frame["step_time_ms"].notna() | choice.frame["bound_ms"].notna())[timed].any():
            from sapptk import viz

            self.figure.children = (bokeh_widget(viz.choice_ranking(choice, top=15)),)
        else:
            self.figure.children = ()

    def use_winner(self) -> None:
        """Set the Explorer's controls to the winner's setup."""
        if self.choice is None or self.choice.best is None:
            return
        cfg = self.choice.best.config
        ex = self.explorer
        ex.schedule.value = cfg.schedule
        ex.stages.value = cfg.stages
        ex.micro_batches.value = cfg.micro_batches
        ex.chunks.value = cfg.chunks
