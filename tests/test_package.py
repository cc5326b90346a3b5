"""The package surface: exports, no heavy or visual imports in the core."""

from __future__ import annotations

import subprocess
import sys


def test_functions_stay_functions_after_their_modules_are_imported():
    code = (
        "import sapptk.balance, sapptk.sweep, sapptk.cli\n"
        "import sapptk\n"
        "assert callable(sapptk.balance) and callable(sapptk.sweep), (sapptk.balance, sapptk.sweep)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_core_does_not_import_figures_or_widgets():
    code = (
        "import sys, sapptk\n"
        "bad = [m for m in ('bokeh', 'ipywidgets', 'matplotlib', 'sapptk.viz', 'sapptk.widgets') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_every_export_exists():
    import sapptk

    for name in sapptk.__all__:
        assert getattr(sapptk, name) is not None, name
