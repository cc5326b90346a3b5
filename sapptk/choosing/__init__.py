"""Choosing the whole pipeline setup: setups enumerated, bounded, pruned, balanced, ranked.

``bounds`` (proven lower bounds on a setup's step time, or a proof that nothing fits),
``layout_bound`` (stronger bounds from whole layouts below an incumbent),
``setups`` (the setups a choice ranges over; DP gradient synchronisation), ``engine``
(:func:`choose`), ``records`` (its rows), ``result`` (:class:`Choice`), ``cards`` (setups from a model card).
"""

from sapptk.choosing.engine import choose
from sapptk.choosing.result import Choice

__all__ = ["Choice", "choose"]
