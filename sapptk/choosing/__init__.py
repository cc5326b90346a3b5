"""Choosing the whole pipeline setup: setups enumerated, bounded, pruned, balanced, ranked.

``bounds`` (proven lower bounds on a setup's step time, or a proof that nothing fits),
``layout_bound`` (stronger bounds from whole layouts below an incumbent),
``setups`` (the setups a choice ranges over; DP gradient synchronisation), ``request``
(:class:`ChooseRequest`, checked once), ``engine`` (:func:`choose`), ``run`` (the queue: one
step per :class:`~sapptk.choosing.state.SetupState`), ``state`` (the states, what twins share),
``balancing`` (batches through the sweep executors, the cache), ``records`` (its rows),
``result`` (:class:`Choice`), ``cards`` (setups from a model card).
"""

from sapptk.choosing.engine import choose
from sapptk.choosing.request import ChooseRequest
from sapptk.choosing.result import Choice

__all__ = ["Choice", "ChooseRequest", "choose"]
