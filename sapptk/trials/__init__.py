"""Trials: run the best few setups of a choice for real, measure, fit, re-rank.

``planning`` (:func:`plan`: one folder per setup with its schedule CSV, launch script,
entry point, profiler settings and manifest), ``runner`` (the entry point torchrun starts;
needs torch), ``ingesting`` (:func:`ingest`: the runs' traces, step times and peaks, and the
costs fitted from them), ``ranking`` (:func:`rerank`: the choice ranked again with them).
"""

from sapptk.trials.ingesting import Calibrated, ingest
from sapptk.trials.planning import plan
from sapptk.trials.ranking import Reranked, rerank

__all__ = ["Calibrated", "Reranked", "ingest", "plan", "rerank"]
