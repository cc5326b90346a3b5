"""The cards shipped with sapptk: model cards (JSON files beside this module, fields of
Hugging Face ``config.json`` files) and hardware cards (:data:`~sapptk.models.layout.HARDWARE`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from sapptk.errors import ProfileError
from sapptk.files import load_document
from sapptk.models.cards import ModelCard
from sapptk.models.layout import HARDWARE, Hardware, hardware_card

__all__ = ["available", "card", "hardware"]

_CARDS = Path(__file__).resolve().parent / "cards"


def _card_files() -> dict[str, Path]:
    return {p.stem: p for p in sorted(_CARDS.glob("*.json"))}


def available(kind: str = "models") -> tuple[str, ...]:
    """Names of the bundled cards: ``"models"`` (for :func:`card`) or ``"hardware"`` (for
    :func:`hardware`)."""
    if kind == "models":
        return tuple(_card_files())
    if kind == "hardware":
        return tuple(HARDWARE)
    raise ProfileError(f"available: kind = {kind!r}: expected 'models' or 'hardware'")


@lru_cache(maxsize=64)
def _bundled(name: str) -> ModelCard:
    path = _card_files()[name]
    data = load_document(path, what="model card", error=ProfileError)
    made = ModelCard.from_hf(data, name=name)
    return replace(made, source=f"bundled card {name!r}: {data.get('_source', path.name)}")


def card(name: str) -> ModelCard:
    """A bundled model card by name (case-insensitive), e.g. ``"llama3.1-70b"``; the error
    lists the names there are."""
    if not isinstance(name, str):
        raise ProfileError(f"model card: name = {name!r}: expected a string, one of {', '.join(available())}")
    key = name.strip().lower()
    if key not in _card_files():
        raise ProfileError(f"model card {name!r} is not bundled: expected one of {', '.join(available())}")
    return _bundled(key)


def hardware(card: str | Hardware | Mapping[str, Any], /, **overrides: Any) -> Hardware:
    """A bundled hardware card by name (``"h100"``, ``"h800"``, ``"h200"``, ``"a100"``,
    ``"b200"``, ``"mi300x"``, ``"ascend910b"``), or a mapping of :class:`Hardware` fields,
    any field overridden (``name`` too: ``hardware("h100", name="my-h100")``)."""
    if "name" not in overrides:
        return hardware_card(card, **overrides)
    rest = {k: v for k, v in overrides.items() if k != "name"}
    base = hardware_card(card, **rest)
    return hardware_card({**{f.name: getattr(base, f.name) for f in fields(base)}, "name": overrides["name"]})
