"""The Explorer's former address, kept so that ``from sapptk.widgets import Explorer`` in
existing notebooks still works: the Explorer lives in :mod:`sapptk.explorer`."""

from sapptk.explorer import EXPORT_FORMATS, Explorer, explorer_from_card, export_texts

__all__ = ["EXPORT_FORMATS", "Explorer", "explorer_from_card", "export_texts"]
