"""Two pieces of the Explorer that are not widgets of their own:

* :class:`InterruptHook` — Kernel → Interrupt reaches a solve started with the Solve
  button. An idle ipykernel ignores SIGINT (it only turns it into ``KeyboardInterrupt``
  while a message is being handled), so a background solve never sees it. The hook puts a
  SIGINT handler in place that calls back the Explorers with a running solve and otherwise
  does what the handler before it did. In a kernel it is placed through ipykernel's own
  save/restore of the SIGINT handler around each message (``kernel.saved_sigint_handler``),
  so the kernel keeps it between messages and a cell that is running still gets its
  ``KeyboardInterrupt``. Only from the main thread of a kernel: elsewhere
  :meth:`InterruptHook.install` returns False.
* :func:`checked_entry` — a text box beside a slider (or a number box) that accepts what a
  person types, puts the nearest allowed value in the control, and says what it changed
  (``"stages: -3 is below 1: set to 1"``), instead of the silent clamping of ipywidgets.
"""

from __future__ import annotations

import math
import signal
import threading
from collections.abc import Callable
from typing import Any

import ipywidgets as w

__all__ = ["InterruptHook", "checked_entry", "corrected"]


class InterruptHook:
    """A SIGINT handler that runs ``callbacks`` while any is registered, and the previous
    handler otherwise. One per process (:data:`HOOK`)."""

    def __init__(self) -> None:
        self._callbacks: dict[int, Callable[[], None]] = {}
        self._previous: Any = None
        self._installed = False
        self._lock = threading.RLock()  # the handler runs on the main thread, maybe inside add()

    def add(self, key: int, callback: Callable[[], None]) -> None:
        with self._lock:
            self._callbacks[key] = callback

    def remove(self, key: int) -> None:
        with self._lock:
            self._callbacks.pop(key, None)

    @property
    def installed(self) -> bool:
        return self._installed

    def install(self) -> bool:
        """Put the handler in place (once) in this IPython kernel; False when there is no
        kernel to hold it or this is not the main thread (then only Cancel stops a solve;
        outside a kernel, Ctrl-C reaches a call waiting in ``wait()`` as usual)."""
        if self._installed:
            return True
        kernel = _kernel()
        if (kernel is None or not hasattr(kernel, "saved_sigint_handler")
                or threading.current_thread() is not threading.main_thread()):
            return False
        # called inside a message handler: ipykernel puts this one back when the handler returns
        self._previous = kernel.saved_sigint_handler
        kernel.saved_sigint_handler = self._handle
        self._installed = True
        return True

    def uninstall(self) -> None:
        """Put the previous handler back (main thread, in the kernel it was installed in)."""
        kernel = _kernel()
        if not self._installed or kernel is None or threading.current_thread() is not threading.main_thread():
            return
        if getattr(kernel, "saved_sigint_handler", None) == self._handle:
            kernel.saved_sigint_handler = self._previous
        if signal.getsignal(signal.SIGINT) == self._handle:
            signal.signal(signal.SIGINT, self._previous)
        self._installed = False

    def _handle(self, signum: int, frame: Any) -> None:
        with self._lock:
            callbacks = list(self._callbacks.values())
        if callbacks:
            for callback in callbacks:
                callback()
            return
        previous = self._previous
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL:
            raise KeyboardInterrupt
        # SIG_IGN: ignored, as before


HOOK = InterruptHook()
"""The process's one hook (SIGINT has one handler)."""


def _kernel() -> Any:
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    shell = get_ipython()
    return getattr(shell, "kernel", None) if shell is not None else None


def corrected(text: str, low: float, high: float, *, integer: bool) -> tuple[float | None, str | None]:
    """The value ``text`` asks for, brought into [``low``, ``high``], and what was changed.

    Returns (value, None) when ``text`` is fine as it is, (nearest allowed value, why) when
    it was out of range or not whole, and (None, why) when it is not a number at all.
    """
    raw = text.strip().replace(",", "").replace("\u2212", "-")
    try:
        value = float(raw)
    except ValueError:
        return None, f"{text.strip()!r} is not a number"
    if not math.isfinite(value):
        return None, f"{text.strip()!r} is not a finite number"
    shown = f"{value:,g}"
    if integer and not value.is_integer():
        value = float(round(value))
        note = f"{shown} is not a whole number: set to {value:,.0f}"
    else:
        note = None
    if value < low:
        return low, f"{shown} is below {low:,g}: set to {low:,g}"
    if value > high:
        return high, f"{shown} is above {high:,g}: set to {high:,g}"
    return value, note


def checked_entry(control: w.ValueWidget, name: str, report: Callable[[str], None], *,
                  low: Callable[[], float] | None = None, high: Callable[[], float] | None = None,
                  width: str = "90px") -> w.Text:
    """A text box kept equal to ``control``'s value; what is typed in it is checked against
    the control's ``min``/``max`` (or ``low()``/``high()``), put in the control, and any
    change is reported as ``"name: why"`` through ``report``."""
    integer = isinstance(control.value, int) and not isinstance(control.value, bool)
    box = w.Text(value=_text(control.value, integer), continuous_update=False, layout=w.Layout(width=width))
    syncing = [False]

    def from_control(change: Any) -> None:
        if not syncing[0]:
            syncing[0] = True
            box.value = _text(change["new"], integer)
            syncing[0] = False

    def from_box(change: Any) -> None:
        if syncing[0]:
            return
        lo = low() if low is not None else float(getattr(control, "min", -math.inf))
        hi = high() if high is not None else float(getattr(control, "max", math.inf))
        value, why = corrected(str(change["new"]), lo, hi, integer=integer)
        syncing[0] = True
        try:
            if value is not None:
                control.value = int(value) if integer else float(value)
            box.value = _text(control.value, integer)
        finally:
            syncing[0] = False
        if why is not None:
            kept = "" if value is not None else f": kept {_text(control.value, integer)}"
            report(f"{name}: {why}{kept}")

    control.observe(from_control, names="value")
    box.observe(from_box, names="value")
    return box


def _text(value: float, integer: bool) -> str:
    return str(int(value)) if integer else f"{float(value):g}"
