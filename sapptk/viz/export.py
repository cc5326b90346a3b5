"""Figures written to files: a standalone HTML page (no network needed), or a PNG or SVG
image through headless Chromium (the ``export`` extra: Selenium, plus a Chromium and its
chromedriver).

:func:`save_html`, :func:`export_png` and :func:`export_svg` take any figure or layout of
:mod:`sapptk.viz` and a path, and return the :class:`~pathlib.Path` of the one file they
wrote (an SVG holds the whole layout, as the PNG does).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bokeh.embed import file_html
from bokeh.models import Plot
from bokeh.resources import INLINE

from sapptk.errors import SapptkError
from sapptk.files import write_text

if TYPE_CHECKING:
    from bokeh.models import UIElement

__all__ = [
    "CHROMIUM_FLAGS",
    "ExportUnavailableError",
    "chromium_driver",
    "close_driver",
    "export_png",
    "export_svg",
    "find_chromium",
    "save_html",
]


def _target(path: str | os.PathLike[str], where: str) -> Path:
    """``path`` with its folder created, or a clear error when it cannot be written."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SapptkError(f"{where}: cannot create the folder {str(path.parent)!r}: {exc.strerror}") from None
    if path.is_dir():
        raise SapptkError(f"{where}: {str(path)!r} is a folder: expected a file name")
    return path


def save_html(fig: UIElement, path: str | os.PathLike[str], *, title: str = "sapptk") -> Path:
    """Write ``fig`` as a standalone HTML page with Bokeh's JS inline (works offline)."""
    path = _target(path, "save_html")
    # atomically, through sapptk.files: a FIFO never blocks, a failed write leaves no half page
    return write_text(path, file_html(fig, INLINE, title), what="HTML page", error=SapptkError)


class ExportUnavailableError(RuntimeError):
    """PNG/SVG export needs Selenium and a Chromium with its driver."""


_EXPORT_HINT = (
    "PNG/SVG export needs the 'export' extra and a Chromium browser with its driver: "
    "pip install 'sapptk[export]' and, on Debian/Ubuntu, apt-get install chromium chromium-driver"
)


def find_chromium() -> tuple[str, str] | None:
    """Paths of a Chromium (or Chrome) binary and its chromedriver, or None."""
    browser = next(
        (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome", "chrome")) if p), None
    )
    driver = shutil.which("chromedriver") or next(
        (p for p in ("/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver") if Path(p).exists()), None
    )
    if browser is None or driver is None:
        return None
    return browser, driver


CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--enable-unsafe-swiftshader",
)


def chromium_driver(*, console_log: bool = False, window: tuple[int, int] = (1400, 1000)) -> Any:
    """A headless Chromium Selenium driver with a fresh profile (caller quits it).

    Raises :class:`ExportUnavailableError` with the install hint when Selenium or
    Chromium/chromedriver is missing.
    """
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError as exc:
        raise ExportUnavailableError(f"{_EXPORT_HINT} (selenium is not installed)") from exc
    found = find_chromium()
    if found is None:
        raise ExportUnavailableError(f"{_EXPORT_HINT} (no chromium/chromedriver on PATH)")
    browser, driver_path = found
    opts = webdriver.ChromeOptions()
    opts.binary_location = browser
    for flag in CHROMIUM_FLAGS:
        opts.add_argument(flag)
    opts.add_argument(f"--window-size={window[0]},{window[1]}")
    profile = tempfile.mkdtemp(prefix="sapptk-chromium-")
    opts.add_argument(f"--user-data-dir={profile}")
    if console_log:
        opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    try:
        drv = webdriver.Chrome(service=Service(executable_path=driver_path), options=opts)
    except Exception as exc:  # selenium raises several kinds here
        shutil.rmtree(profile, ignore_errors=True)
        raise ExportUnavailableError(f"{_EXPORT_HINT} (could not start {browser}: {exc})") from exc
    drv._sapptk_profile = profile  # removed by close_driver
    return drv


def close_driver(drv: Any) -> None:
    """Quit a driver of :func:`chromium_driver` and remove its browser profile."""
    profile = getattr(drv, "_sapptk_profile", None)
    try:
        drv.quit()
    finally:
        if profile:
            shutil.rmtree(profile, ignore_errors=True)


@contextmanager
def _canvas_backend(fig: UIElement) -> Iterator[None]:
    """Render plots on the 2D canvas while exporting, then put their backends back.

    A static image gains nothing from WebGL, and headless Chromium has no GPU: its
    software WebGL is several times slower than the canvas on large timelines.
    """
    plots = [p for p in fig.select({"type": Plot}) if p.output_backend == "webgl"]
    for p in plots:
        p.output_backend = "canvas"
    try:
        yield
    finally:
        for p in plots:
            p.output_backend = "webgl"


def export_png(fig: UIElement, path: str | os.PathLike[str], *, timeout: int = 60) -> Path:
    """Write ``fig`` as one PNG through headless Chromium (needs the ``export`` extra)."""
    from bokeh.io import export_png as _bokeh_export_png

    path = _target(path, "export_png")
    drv = chromium_driver()
    try:
        with _canvas_backend(fig):
            _bokeh_export_png(fig, filename=str(path), webdriver=drv, timeout=timeout)
    finally:
        close_driver(drv)
    return path


def export_svg(fig: UIElement, path: str | os.PathLike[str], *, timeout: int = 60) -> Path:
    """Write ``fig`` as one SVG through headless Chromium (needs the ``export`` extra);
    a layout of several plots is one SVG, as in the PNG."""
    from bokeh.io import export_svg as _bokeh_export_svg

    path = _target(path, "export_svg")
    drv = chromium_driver()
    try:
        with _canvas_backend(fig):
            names = _bokeh_export_svg(fig, filename=str(path), webdriver=drv, timeout=timeout)
    finally:
        close_driver(drv)
    if [Path(n) for n in names] != [path]:
        raise RuntimeError(f"export_svg: expected Bokeh to write one SVG, {str(path)!r}; it wrote {names}")
    return path
