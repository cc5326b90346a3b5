"""BokehJS in a notebook: loaded inline (no network needed), but not stored in the file.

Bokeh's own ``output_notebook(INLINE)`` writes BokehJS into the first cell's output twice
(as JavaScript and as Bokeh's load bundle: about 8 MB), so every saved notebook weighs
8 MB. :func:`output_notebook` publishes the same load script inside a hidden
``ipywidgets.Output``: the browser runs it as before, and the notebook file keeps only a
reference to the widget (JupyterLab and Notebook 7 do not save widget state unless asked
to). The figures of later cells are stored as usual (their documents, without BokehJS).

Reopening a saved notebook shows its figures again once this cell has run.
"""

from __future__ import annotations

from typing import Any

__all__ = ["output_notebook"]


def _in_kernel() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def output_notebook(*, hide_banner: bool = True) -> Any:
    """Show Bokeh figures in this notebook, with BokehJS inline but kept out of the file.

    Call it once, in the first cell (instead of ``bokeh.io.output_notebook``). In a Jupyter
    kernel with ipywidgets it returns the hidden ``Output`` widget that carried BokehJS;
    elsewhere (a plain Python shell, no ipywidgets) it falls back to Bokeh's
    ``output_notebook(INLINE)`` and returns None.
    """
    from bokeh.io import output_notebook as bokeh_output_notebook
    from bokeh.resources import INLINE

    if not _in_kernel():
        bokeh_output_notebook(INLINE, hide_banner=hide_banner)
        return None
    try:
        import ipywidgets
        from IPython.display import display
    except ImportError:
        bokeh_output_notebook(INLINE, hide_banner=hide_banner)
        return None
    loader = ipywidgets.Output(layout=ipywidgets.Layout(display="none"))
    display(loader)
    with loader:
        bokeh_output_notebook(INLINE, hide_banner=hide_banner)
    return loader
