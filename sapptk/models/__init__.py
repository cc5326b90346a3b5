"""Model cards, parallel layouts and hardware cards: what a plan starts from before any run.

* :class:`ModelCard` (``ModelCard.from_hf(path_or_dict)``, ``.parameters()``, ``.groups``)
  and the bundled cards: :func:`card`, :func:`available`;
* :class:`Parallel` (TP, SP, CP, EP, DP, optimizer sharding, micro-batch, sequence length,
  dtypes, Adam, flash attention) and :class:`Hardware` (:func:`hardware`);
* :func:`estimate_profile` (re-exported as ``sapptk.estimate_profile``): a
  :class:`~sapptk.profile.Profile` from the three (``docs/estimation.md``);
* :func:`operators`: the table of every layer's operators the estimate's times come from,
  and the framework presets (:data:`FRAMEWORKS`, :func:`framework`);
* measured runs (:class:`MeasuredRow`, :func:`measured_row`, :func:`load_measured_rows`) to
  judge estimates against and to fit a hardware card on: ``sapptk.fit_hardware`` (in
  :mod:`sapptk.models.hardware_fit`, which sits above the simulator it needs).

Bundled cards are small JSON files in this package (Hugging Face ``config.json`` fields);
nothing is downloaded.
"""

from __future__ import annotations

from sapptk.models.bundled import available, card, hardware
from sapptk.models.cards import MODEL_TYPES, CardGroup, Mla, ModelCard, Moe
from sapptk.models.estimate import MEMORY_FIGURES, NOT_MODELLED, estimate_profile, layer_tensors, operators
from sapptk.models.frameworks import FRAMEWORKS, Framework, framework
from sapptk.models.layout import HARDWARE, SHARDINGS, Hardware, Parallel
from sapptk.models.measured import MeasuredRow, load_measured_rows, measured_row

__all__ = [
    "FRAMEWORKS",
    "HARDWARE",
    "MEMORY_FIGURES",
    "MODEL_TYPES",
    "NOT_MODELLED",
    "SHARDINGS",
    "CardGroup",
    "Framework",
    "Hardware",
    "MeasuredRow",
    "Mla",
    "ModelCard",
    "Moe",
    "Parallel",
    "available",
    "card",
    "estimate_profile",
    "framework",
    "hardware",
    "layer_tensors",
    "load_measured_rows",
    "measured_row",
    "operators",
]
