"""report.html in a real headless Chromium (the distribution's package; `make test` installs it):
each report (run, ablation, compare) loads with no console errors, every image decodes, and a
full-page screenshot is not blank. Screenshots stay in the test's tmp folder for a human to look at
(`pytest --basetemp=DIR tests/test_report_browser.py`)."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import pytest

from harness.report.api import report_main
from tests.report_builders import config, iter_run, write_ablation

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = pytest.mark.skipif(not Path(CHROMIUM).is_file(),
                                reason="no chromium: `make test` installs it (apt-get install chromium)")
# Chromium as root in a container: no sandbox, no GPU, nothing fetched in the background.
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("browser")
    runs, rep = root / "runs", root / "rep"
    times = {"b1": [10, 11, 10.5], "b2": [10.2, 10.8, 11], "c1": [9, 9.5, 9.2], "c2": [9.1, 9.4, 9.6],
             "s1": [10, 10, 10]}
    for run_id, t in times.items():
        iter_run(runs, run_id, {0: t, 1: [x - 0.5 for x in t]}, warmup=[50.0],
                 flags={"cuda_graphs": run_id.startswith(("c", "a")), "skip_splits_a2a": False},
                 reasons={"cuda_graphs": "CUDA only: this run is on cpu"} if run_id.startswith("c") else None)
    off = {"cuda_graphs": False, "skip_splits_a2a": False}
    write_ablation(runs, "ab", [
        config("baseline", "baseline", None, ["b1", "b2"], requested=off),
        config("+cuda_graphs", "alone", "cuda_graphs", ["c1", "c2"], requested={**off, "cuda_graphs": True}),
        config("+skip_splits_a2a", "alone", "skip_splits_a2a", ["s1"], requested={**off, "skip_splits_a2a": True}),
    ])
    assert report_main("b1", runs, rep) == 0
    assert report_main("b1,c1", runs, rep) == 0
    assert report_main(ablation="ab", runs_root=runs, reports_root=rep) == 0
    return {"run": rep / "b1", "compare": rep / "compare-b1-vs-c1", "ablation": rep / "ablation-ab"}


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        yield b
        b.close()


def _blank(png: bytes) -> bool:
    from matplotlib.image import imread

    px = imread(io.BytesIO(png), format="png")[..., :3]
    # Not blank: a visible share of pixels differ from the page background (white).
    return float((px.min(axis=-1) < 0.9).mean()) < 0.01


@pytest.mark.parametrize("kind", ["run", "compare", "ablation"])
def test_report_html_in_chromium(reports, browser, kind):
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    errors: list[str] = []
    page.on("console", lambda m: errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    page.on("requestfailed", lambda r: errors.append(f"request failed: {r.url}"))
    page.goto((reports[kind] / "report.html").resolve().as_uri(), wait_until="load")
    images = page.eval_on_selector_all("img", "els => els.map(e => [e.alt, e.complete, e.naturalWidth])")
    assert images, "the report embeds no image"
    undecoded = [alt for alt, complete, width in images if not (complete and width > 0)]
    assert not undecoded, f"images that did not decode: {undecoded}"
    assert page.inner_text("h2") == "Findings"  # the answer comes first
    shot = page.screenshot(full_page=True)
    (reports[kind] / f"screenshot-{kind}.png").write_bytes(shot)
    assert not _blank(shot)
    assert not errors, errors
    page.close()


def test_blank_detector_can_fail():
    from matplotlib.figure import Figure

    buf = io.BytesIO()
    Figure(figsize=(2, 2), facecolor="white").savefig(buf, format="png")
    assert _blank(buf.getvalue())
    fig = Figure(figsize=(2, 2))
    fig.add_subplot().bar([0, 1], [1, 2])
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    assert not _blank(buf.getvalue())
