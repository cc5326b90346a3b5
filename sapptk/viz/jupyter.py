"""BokehJS in a notebook: loaded inline (no network needed), but not stored in the file.

Bokeh's own ``output_notebook(INLINE)`` writes BokehJS into the first cell's output twice
(as JavaScript and as Bokeh's load bundle: about 8 MB), so every saved notebook weighs
8 MB. :func:`output_notebook` publishes the same load script, which the browser runs as
soon as it arrives, then clears the cell's output: the notebook file keeps none of it. The
figures of later cells are stored as usual (their documents, without BokehJS). The script
goes once (Bokeh's message carries it twice) and without MathJax: 2.1 MB through the
kernel's channel instead of 8.6 MB.

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


def output_notebook(*, hide_banner: bool = True) -> None:
    """Show Bokeh figures in this notebook, with BokehJS inline but kept out of the file.

    Call it once, in the first cell (instead of ``bokeh.io.output_notebook``), before the
    cell shows anything else: it publishes Bokeh's loader, which the browser runs at once,
    then clears the cell's output, so the saved notebook keeps nothing of it. Outside a
    Jupyter kernel it is Bokeh's ``output_notebook(INLINE)``.
    """
    from bokeh.io import output_notebook as bokeh_output_notebook
    from bokeh.resources import INLINE, Resources

    if not _in_kernel():
        bokeh_output_notebook(INLINE, hide_banner=hide_banner)
        return
    import bokeh.io.notebook as bokeh_notebook
    from IPython.display import clear_output

    # BokehJS without MathJax (no figure of sapptk writes LaTeX): 2.1 MB instead of 4 MB
    resources = Resources(mode="inline", components=[c for c in INLINE.components if c != "bokeh-mathjax"])
    publish = bokeh_notebook.publish_display_data

    def publish_once(data: dict[str, Any], *args: Any, **kwargs: Any) -> None:
        """Bokeh publishes its loader twice in one message (as JavaScript, and as its own
        type for its JupyterLab renderer): send the JupyterLab one once, as JavaScript."""
        if bokeh_notebook.LOAD_MIME_TYPE in data and bokeh_notebook.JS_MIME_TYPE in data:
            data = {bokeh_notebook.JS_MIME_TYPE: data[bokeh_notebook.LOAD_MIME_TYPE]}
        publish(data, *args, **kwargs)

    bokeh_notebook.publish_display_data = publish_once
    try:
        bokeh_output_notebook(resources, hide_banner=hide_banner)
    finally:
        bokeh_notebook.publish_display_data = publish
    clear_output()  # the browser ran the loader when it arrived; the file keeps none of it
