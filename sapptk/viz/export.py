"""Figures written to files: a standalone HTML page (no network needed), or a PNG, SVG or
PDF through headless Chromium (the ``export`` extra: Selenium, plus a Chromium and its
chromedriver).

:func:`save_html`, :func:`export_png`, :func:`export_svg` and :func:`export_pdf` take any
figure or layout of :mod:`sapptk.viz` and a path, and return the :class:`~pathlib.Path` of
the one file they wrote (an SVG holds the whole layout, as the PNG does). The SVG and the
PDF are vector graphics (the PDF is the SVG printed by Chromium, one page of the figure's
size); the PNG is drawn at ``dpi`` (96 px per inch is the figure's own size) and records it.
For a paper, draw the figures in ``viz.style("paper")`` first. Several exports can share
one browser (``driver=``, from :func:`chromium_driver`; the caller closes it).
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
    "export_pdf",
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


def chromium_driver(*, console_log: bool = False, window: tuple[int, int] = (1400, 1000),
                    device_scale: float = 1.0) -> Any:
    """A headless Chromium Selenium driver with a fresh profile (caller quits it);
    ``device_scale``: device pixels per CSS pixel (a PNG above 96 dpi needs dpi / 96).

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
    if device_scale != 1.0:
        opts.add_argument(f"--force-device-scale-factor={device_scale:g}")
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
    """Ready ``fig`` for a file, then put it back as it was: plots drawn on the 2D canvas, and
    a layout that stretches to its output (the notebook style) fixed at the width it was
    built for (a file has no output to stretch to).

    A static image gains nothing from WebGL, and headless Chromium has no GPU: its
    software WebGL is several times slower than the canvas on large timelines.
    """
    from bokeh.models import LayoutDOM

    plots = [p for p in fig.select({"type": Plot}) if p.output_backend == "webgl"]
    stretched = [(m, m.sizing_mode, m.width_policy) for m in [fig, *fig.select({"type": LayoutDOM})]
                 if getattr(m, "sizing_mode", None) == "stretch_width"]
    for p in plots:
        p.output_backend = "canvas"
    for m, _, _ in stretched:
        m.sizing_mode = None  # Bokeh's default: the width it was built for
        m.width_policy = "auto"  # not "max", which a page without an output area shrinks to the minimum
    try:
        yield
    finally:
        for p in plots:
            p.output_backend = "webgl"
        for m, mode, policy in stretched:
            m.sizing_mode = mode
            m.width_policy = policy


@contextmanager
def _browser(driver: Any, device_scale: float = 1.0) -> Iterator[Any]:
    """``driver``, or a fresh one closed at the end."""
    if driver is not None:
        yield driver
        return
    drv = chromium_driver(device_scale=device_scale)
    try:
        yield drv
    finally:
        close_driver(drv)


def export_png(fig: UIElement, path: str | os.PathLike[str], *, dpi: float = 96, timeout: int = 60,
               driver: Any = None) -> Path:
    """Write ``fig`` as one PNG through headless Chromium (needs the ``export`` extra), drawn
    at ``dpi`` pixels per inch of the figure's size (96: one pixel per CSS pixel; 300 for
    print) and recorded in the file."""
    from bokeh.io import export_png as _bokeh_export_png

    if isinstance(dpi, bool) or not isinstance(dpi, (int, float)) or not 24 <= dpi <= 1200:
        raise SapptkError(f"export_png: dpi = {dpi!r}: expected a number from 24 to 1200")
    path = _target(path, "export_png")
    scale = dpi / 96
    if driver is not None and driver.execute_script("return window.devicePixelRatio") < scale:
        driver = None  # Chromium draws this many device pixels per CSS pixel only when started so
    with _browser(driver, device_scale=max(scale, 1.0)) as drv, _canvas_backend(fig):
        _bokeh_export_png(fig, filename=str(path), webdriver=drv, timeout=timeout, scale_factor=scale)
    try:
        from PIL import Image
    except ImportError as exc:
        raise ExportUnavailableError(f"{_EXPORT_HINT} (pillow is not installed)") from exc
    with Image.open(path) as img:
        img.load()
        img.save(path, dpi=(dpi, dpi))
    return path


def export_svg(fig: UIElement, path: str | os.PathLike[str], *, timeout: int = 60, driver: Any = None) -> Path:
    """Write ``fig`` as one SVG through headless Chromium (needs the ``export`` extra);
    a layout of several plots is one SVG, as in the PNG."""
    from bokeh.io import export_svg as _bokeh_export_svg

    path = _target(path, "export_svg")
    with _browser(driver) as drv, _canvas_backend(fig):
        names = _bokeh_export_svg(fig, filename=str(path), webdriver=drv, timeout=timeout)
    if [Path(n) for n in names] != [path]:
        raise RuntimeError(f"export_svg: expected Bokeh to write one SVG, {str(path)!r}; it wrote {names}")
    return path


def export_pdf(fig: UIElement, path: str | os.PathLike[str], *, timeout: int = 60, driver: Any = None) -> Path:
    """Write ``fig`` as a one-page vector PDF of its own size: its SVG (:func:`export_svg`)
    printed by headless Chromium (needs the ``export`` extra)."""
    import base64
    import re

    from selenium.webdriver.common.print_page_options import PrintOptions

    path = _target(path, "export_pdf")
    with _browser(driver) as drv, tempfile.TemporaryDirectory(prefix="sapptk-pdf-") as tmp:
        svg = export_svg(fig, Path(tmp) / "figure.svg", timeout=timeout, driver=drv)
        head = svg.read_text(encoding="utf-8")[:2000]
        size = [re.search(rf'\b{k}="([0-9.]+)', head) for k in ("width", "height")]
        if not all(size):
            raise RuntimeError(f"export_pdf: the SVG Bokeh wrote has no width and height: {head[:200]!r}")
        width_px, height_px = (float(m.group(1)) for m in size)  # type: ignore[union-attr]
        page = Path(tmp) / "figure.html"
        page.write_text('<!DOCTYPE html><html><head><style>@page { margin: 0 } html, body { margin: 0; padding: 0 }'
                        'img { display: block }</style></head><body>'
                        f'<img src="figure.svg" width="{width_px:g}" height="{height_px:g}"></body></html>',
                        encoding="utf-8")
        drv.get(page.as_uri())
        options = PrintOptions()
        options.page_width = width_px * 2.54 / 96  # cm
        options.page_height = height_px * 2.54 / 96
        options.margin_top = options.margin_bottom = options.margin_left = options.margin_right = 0
        options.background = True
        options.shrink_to_fit = False
        data = base64.b64decode(drv.print_page(options))
    try:
        path.write_bytes(data)
    except OSError as exc:
        raise SapptkError(f"export_pdf: cannot write {str(path)!r}: {exc.strerror}") from None
    return path
