"""The search's sense of time: the caller's deadline and the caller's stop event, in one place.

Every phase asks the same :class:`Clock` whether it may go on, so a time limit and a
``stop`` request end the search the same way: the phase returns what it has, and the
search returns its best plan so far. One call (:func:`sapptk.solve`) makes one clock; a
phase that may use only part of the time (the per-stage solve before the offload search,
say) gets :meth:`Clock.phase`: the same time source, the same stop event, an earlier
deadline, and the call's whole limit for its messages. One time source throughout:
``time.perf_counter``.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

__all__ = ["Clock"]


@dataclass
class Clock:
    """A wall-clock deadline (``time.perf_counter`` seconds) and an optional stop event.

    ``deterministic`` searches count their work instead of reading this clock where they
    can; the deadline still holds for them (it is a promise to the caller).

    ``stall`` (seconds or None): once a plan is in hand, the search also ends when neither the
    plan nor the bound has improved for this long (:meth:`progress` marks an improvement).
    ``whole`` and ``call_deadline`` (None unless this clock is one phase of a call,
    :meth:`phase`): the time limit and the deadline of the whole call; messages name the former.
    """

    limit: float
    stop: threading.Event | None = None
    start: float = field(default_factory=time.perf_counter)
    stall: float | None = None
    last_progress: float | None = None
    whole: float | None = None
    call_deadline: float | None = None

    @property
    def call_limit(self) -> float:
        """The time limit the caller gave for the whole call, seconds."""
        return self.limit if self.whole is None else self.whole

    def phase(self, seconds: float, *, stall: float | None = None) -> Clock:
        """A clock for one phase: ``seconds`` from now, never past this clock's deadline; the
        same stop event; ``stall`` its own (a phase's search may stall early). Its ``limit``
        stays ``seconds`` (a deterministic search sizes its work by it, so the same request
        does the same work however long the imports before it took); its deadline is capped."""
        return Clock(max(0.0, float(seconds)), self.stop, stall=stall, whole=self.call_limit,
                     call_deadline=self.deadline)

    def describe_limit(self) -> str:
        """How messages name the limit that ended this clock: the call's own, or this phase's share of it."""
        if self.call_deadline is None or self.start + self.limit >= self.call_deadline - 1e-6:
            return f"the time limit of {self.call_limit:g} s"
        return f"this phase's share ({self.limit:.3g} s) of the {self.call_limit:g} s time limit"

    def progress(self) -> None:
        """The plan or the bound improved: the stall time counts from now."""
        self.last_progress = time.perf_counter()

    @property
    def stalled(self) -> bool:
        """Whether ``stall`` seconds passed since the last improvement (never before the first)."""
        return (self.stall is not None and self.last_progress is not None
                and time.perf_counter() - self.last_progress >= self.stall)

    @property
    def deadline(self) -> float:
        """When this clock runs out: ``start + limit``, and never past the call's deadline."""
        own = self.start + self.limit
        return own if self.call_deadline is None else min(own, self.call_deadline)

    @staticmethod
    def now() -> float:
        return time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def remaining(self) -> float:
        """Seconds left (0 once stopped, stalled or past the deadline)."""
        if self.stopped or self.stalled:
            return 0.0
        return max(0.0, self.deadline - time.perf_counter())

    @property
    def stopped(self) -> bool:
        """Whether the caller asked the search to stop."""
        return self.stop is not None and self.stop.is_set()

    def expired(self) -> bool:
        """Past the deadline, stopped, or stalled."""
        return self.stopped or self.stalled or time.perf_counter() >= self.deadline

    def until(self, share: float) -> float:
        """The ``perf_counter`` time at which ``share`` of the time left now is used up."""
        return time.perf_counter() + share * self.remaining()
