"""SIGINT (Ctrl-C, Jupyter's Kernel → Interrupt) during a solve: never fatal, always clean.

CP-SAT's own SIGINT handling is off on every solver sapptk makes (``catch_sigint_signal =
False``): with it on, OR-Tools leaves SIGINT at its default action after a solve, and the next
interrupt kills the process (a Jupyter kernel "dies").

A solve started from the main thread (where Python delivers signals) runs its search in a
helper thread while the main thread waits, so an interrupt is seen at once even while CP-SAT
holds the search in native code. The interrupt sets the search's stop event; the search ends
within about a second, and :func:`interruptible` then raises :class:`KeyboardInterrupt` in the
caller, saying how long the solve ran. (A second interrupt while the search winds down raises
at once.) To keep the best plan of an interrupted solve instead, pass a ``stop`` event and set
it: the solve returns its best plan so far. Off the main thread, nothing changes: signals
never reach those threads, and the caller's ``stop`` event is the way to end a solve.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["EitherEvent", "interruptible"]

T = TypeVar("T")
_POLL_S = 0.1


class EitherEvent:
    """Set when either the caller's event (may be None) or this one is set; setting it never
    touches the caller's event (nothing the user gave is mutated)."""

    def __init__(self, outer: Any) -> None:
        self.outer = outer
        self.own = threading.Event()

    def is_set(self) -> bool:
        return self.own.is_set() or (self.outer is not None and bool(self.outer.is_set()))

    def set(self) -> None:
        self.own.set()


def _signals_reach_us() -> bool:
    """Whether a SIGINT would be turned into Python code in this thread."""
    if threading.current_thread() is not threading.main_thread():
        return False
    try:
        return callable(signal.getsignal(signal.SIGINT))
    except (ValueError, OSError):
        return False


def interruptible(work: Callable[[Any], T], stop: Any, what: str = "solve") -> T:
    """``work(stop_event)``, interruptible by SIGINT when called from the main thread (see the
    module docstring); elsewhere simply ``work(stop)``."""
    if not _signals_reach_us():
        return work(stop)
    event = EitherEvent(stop)
    box: dict[str, Any] = {}
    finished = threading.Event()  # not Thread.join: a join interrupted by a signal marks a running thread stopped

    def run() -> None:
        try:
            box["value"] = work(event)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread below
            box["error"] = exc
        finally:
            finished.set()

    began = time.perf_counter()
    worker = threading.Thread(target=run, name=f"sapptk-{what}", daemon=True)
    worker.start()
    try:
        while not finished.wait(_POLL_S):
            pass
    except KeyboardInterrupt:
        event.set()  # the search returns what it has within about a second
        while not finished.wait(_POLL_S):  # a second interrupt raises from here at once
            pass
        raise KeyboardInterrupt(f"{what} interrupted (SIGINT) after {time.perf_counter() - began:.1f} s; the search "
                                "stopped. To keep the best plan so far, pass stop=threading.Event() and set it "
                                "instead") from None
    if "error" in box:
        raise box["error"]
    return box["value"]
