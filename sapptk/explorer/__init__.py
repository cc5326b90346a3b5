"""The Explorer: an ipywidgets planner for one profile, in one package.

* :mod:`~sapptk.explorer.app` — :class:`Explorer` (controls, status line, result tabs; a
  solve on a background thread) and :func:`explorer_from_card`;
* :mod:`~sapptk.explorer.controls` — the controls in two columns, read back as a config
  and the solver's levers;
* :mod:`~sapptk.explorer.tabs` — the result tabs (timeline, per device, YAML, memory &
  time, exports) and their texts;
* :mod:`~sapptk.explorer.choose_tab` — the "choose" tab (:class:`ChoosePanel`: which setup
  to run, on a background thread with Cancel and progress);
* :mod:`~sapptk.explorer.inputs` — the kernel-interrupt hook and typed entries.

Nothing of the core imports this package (it needs ipywidgets and jupyter_bokeh).
"""

from sapptk.explorer.app import EXPORT_FORMATS, Explorer, explorer_from_card, export_texts
from sapptk.explorer.choose_tab import ChoosePanel

__all__ = ["EXPORT_FORMATS", "ChoosePanel", "Explorer", "explorer_from_card", "export_texts"]
