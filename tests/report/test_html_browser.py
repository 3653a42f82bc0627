"""Each kind of HTML report in a real headless Chromium (Debian's ``chromium``, which
``.ci/run`` installs): no console errors, nothing loaded from the network, the iteration time and
memory shown equal the JSON's, figures drawn from the JSON's values, and a screenshot per kind in
the test's temporary folder (copied to ``$BLUEPRINTING_SCREENSHOT_DIR`` when it is set).

Playwright drives the system browser (``executable_path``); it never downloads one."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from blueprinting.report.html.page import gib_label, seconds_label
from tests.report.html_cases import PLAN_ARGS, SEARCH_ARGS, run_sweep_with_html, run_with_html

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

CHROMIUM = Path("/usr/bin/chromium")
# Flags this kind of machine needs (no sandbox as root, no GPU), and no traffic of the browser's
# own: the network check below must see only the page's requests.
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not CHROMIUM.exists():
        pytest.skip(
            f"headless Chromium not found at {CHROMIUM} (Debian package `chromium`, which "
            ".ci/run installs with apt-get); the browser tests of the HTML reports are skipped"
        )
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="playwright (a [dev] dependency) is not installed"
    )
    with sync_api.sync_playwright() as pw:
        # launch() gives the browser a fresh temporary profile of its own.
        chromium = pw.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_FLAGS
        )
        yield chromium
        chromium.close()


@dataclass
class Loaded:
    page: Page
    url: str
    problems: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)


def _open(browser: Browser, path: Path) -> Loaded:
    context = browser.new_context(viewport={"width": 1300, "height": 900})
    context.grant_permissions(["clipboard-read", "clipboard-write"])
    page = context.new_page()
    loaded = Loaded(page=page, url=path.resolve().as_uri())
    page.on(
        "console",
        lambda m: (
            loaded.problems.append(f"console {m.type}: {m.text}")
            if m.type in ("error", "assert")
            else None
        ),
    )
    page.on("pageerror", lambda e: loaded.problems.append(f"page error: {e}"))
    page.on("request", lambda r: loaded.requests.append(r.url))
    page.on("requestfailed", lambda r: loaded.problems.append(f"request failed: {r.url}"))
    page.goto(loaded.url, wait_until="load")
    page.evaluate("() => window.blueprintingReady.then(() => true)")
    return loaded


def _finish(loaded: Loaded, kind: str, tmp_path: Path) -> Path:
    """The checks every kind shares, then the screenshot."""
    assert loaded.problems == []
    assert loaded.requests == [loaded.url], "the page loaded something besides itself"
    shot = tmp_path / f"{kind}.png"
    loaded.page.screenshot(path=str(shot), full_page=True)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert shot.stat().st_size > 20_000
    keep = os.environ.get("BLUEPRINTING_SCREENSHOT_DIR")
    if keep:
        shutil.copy(shot, Path(keep) / shot.name)
    loaded.page.context.close()
    return shot


def _shown(page: Page, key: str) -> tuple[str, str]:
    """(data-value, text) of the first element showing JSON key ``key``."""
    element = page.locator(f'[data-key="{key}"]').first
    value = element.get_attribute("data-value")
    assert value is not None
    return value, element.inner_text()


def _check_plan_figures(page: Page, document: dict[str, Any]) -> None:
    total = document["iteration_time_s"]
    assert _shown(page, "iteration_time_s") == (repr(total), seconds_label(total))
    memory = document["memory_bytes"]
    for key in ("total", "reserved_peak", "capacity"):
        value = memory[key]
        assert _shown(page, f"memory_bytes.{key}") == (str(value), gib_label(value))
    traces = page.evaluate(
        "() => document.getElementById('fig-time').data.map(t => [t.name, t.x[0]])"
    )
    assert dict(traces) == document["time_breakdown_s"]
    assert sum(x for _, x in traces) == pytest.approx(total, rel=1e-12)
    stacked = page.evaluate(
        "() => document.getElementById('fig-memory').data.map(t => t.customdata)"
    )
    per_stage = [sum(column) for column in zip(*stacked, strict=True)]
    assert per_stage == document["memory_reserved_peak_bytes_per_stage"]
    # The copy button puts exactly the flags on the clipboard.
    page.locator("button.copy").first.click()
    page.wait_for_function("() => document.querySelector('button.copy').textContent !== 'Copy'")
    assert page.locator("button.copy").first.inner_text() == "Copied"
    copied = page.evaluate("() => navigator.clipboard.readText()")
    assert copied == " ".join(document["megatron_args"])


def test_plan_page(browser: Browser, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "plan.html"
    document = run_with_html(capsys, "plan", PLAN_ARGS, out)
    loaded = _open(browser, out)
    _check_plan_figures(loaded.page, document)
    _finish(loaded, "plan", tmp_path)


def test_simulate_page(
    browser: Browser, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "simulate.html"
    document = run_with_html(capsys, "simulate", PLAN_ARGS, out)
    loaded = _open(browser, out)
    page = loaded.page
    _check_plan_figures(page, document)
    simulation = document["simulation"]
    value = simulation["iteration_time_s"]
    assert _shown(page, "simulation.iteration_time_s") == (repr(value), seconds_label(value))
    bars = page.evaluate(
        "() => document.getElementById('fig-timeline').data.reduce((n, t) => n + t.x.length, 0)"
    )
    assert bars == simulation["commands"] == 248
    assert page.locator("#timeline-note").inner_text().startswith("All 248 commands")
    # Hovering the first forward bar names the command.
    page.evaluate("() => Plotly.Fx.hover('fig-timeline', [{curveNumber: 0, pointNumber: 0}])")
    hover = page.locator("#fig-timeline .hovertext").first.text_content()
    assert hover is not None
    assert "F forward: microbatch 1, chunk 0" in hover
    assert "rank 0" in hover
    _finish(loaded, "simulate", tmp_path)


def test_search_page(browser: Browser, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "search.html"
    document = run_with_html(capsys, "search", SEARCH_ARGS, out)
    loaded = _open(browser, out)
    page = loaded.page
    ranked = document["ranked"]
    rows = page.locator("#ranked-table tbody tr")
    assert rows.count() == len(ranked) == 5
    for entry in ranked:
        at = f"ranked[{entry['rank'] - 1}]"
        time_s = entry["iteration_time_s"]
        assert _shown(page, f"{at}.iteration_time_s") == (repr(time_s), seconds_label(time_s))
        total = entry["memory_bytes"]["total"]
        assert _shown(page, f"{at}.memory_bytes.total") == (str(total), gib_label(total))
    front = page.evaluate(
        "() => { const t = document.getElementById('fig-pareto').data[0]; return [t.x, t.y]; }"
    )
    assert front[1] == [p["iteration_time_s"] for p in document["pareto_front"]]
    assert front[0] == [p["memory_total_bytes"] / 2**30 for p in document["pareto_front"]]
    # Sorting by reserved peak, descending (second click), puts the largest first.
    header = page.locator("#ranked-table thead th", has_text="reserved peak")
    header.click()
    header.click()
    assert header.get_attribute("aria-sort") == "descending"
    order = [int(str(r.get_attribute("data-rank"))) for r in rows.all()]
    by_peak = sorted(ranked, key=lambda e: -e["memory_bytes"]["reserved_peak"])
    assert [e["memory_bytes"]["reserved_peak"] for e in ranked if e["rank"] == order[0]] == [
        by_peak[0]["memory_bytes"]["reserved_peak"]
    ]
    assert sorted(order) == [1, 2, 3, 4, 5]
    _finish(loaded, "search", tmp_path)


def test_sweep_page(
    browser: Browser,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    document, out = run_sweep_with_html(capsys, monkeypatch, tmp_path)
    loaded = _open(browser, out)
    page = loaded.page
    rows = document["rows"]
    table = page.locator("#rows-table tbody tr")
    assert table.count() == len(rows) == 12
    for index, row in enumerate(rows):
        at = f"rows[{index}]"
        if row["status"] != "ok":
            reason = page.locator(f'#rows-table tr[data-row="{index}"] td.reason')
            assert reason.inner_text() == row["reason"]
            continue
        time_s = row["iteration_time_s"]
        assert _shown(page, f"{at}.iteration_time_s") == (repr(time_s), seconds_label(time_s))
        tokens = row["tokens_per_second"]
        assert _shown(page, f"{at}.tokens_per_second") == (repr(tokens), f"{tokens:,.0f}")
        peak = row["memory_reserved_peak_bytes"]
        assert _shown(page, f"{at}.memory_reserved_peak_bytes") == (str(peak), gib_label(peak))
        assert _shown(page, f"{at}.strategy_text")[1] == row["strategy_text"]
    # The drawn lines are the JSON's tokens/s of gpt-1.7b's ok rows, per system.
    drawn = page.evaluate(
        "() => document.getElementById('fig-curves').data.map(t => [t.name, t.x, t.y])"
    )
    for name, xs, ys in drawn[:2]:
        ok = [r for r in rows if (r["model"], r["system"], r["status"]) == ("gpt-1.7b", name, "ok")]
        assert (xs, ys) == ([r["gpus"] for r in ok], [r["tokens_per_second"] for r in ok])
    # A grey heatmap cell names why its row has no strategy.
    page.evaluate("() => Plotly.Fx.hover('fig-mfu', {xval: 0, yval: 0})")
    hover = page.locator("#fig-mfu .hovertext").first.text_content()
    assert hover is not None
    assert "gpt-1.7b / dgx-h100, 7 GPUs: no strategy" in hover
    assert str(rows[0]["reason"]).split(", most often")[0] in hover
    # Sorting by tokens/s, descending: the fastest row first, the rows without one last.
    header = page.locator("#rows-table thead th", has_text="tokens / s")
    header.click()
    header.click()
    assert header.get_attribute("aria-sort") == "descending"
    order = [int(str(r.get_attribute("data-row"))) for r in table.all()]
    ok_rows = [i for i, r in enumerate(rows) if r["status"] == "ok"]
    assert order[:4] == sorted(ok_rows, key=lambda i: -rows[i]["tokens_per_second"])
    assert sorted(order[4:]) == [i for i in range(12) if i not in ok_rows]
    # The copy button puts exactly the first best strategy's flags on the clipboard.
    page.locator("button.copy").first.click()
    page.wait_for_function("() => document.querySelector('button.copy').textContent !== 'Copy'")
    assert page.evaluate("() => navigator.clipboard.readText()") == " ".join(
        rows[ok_rows[0]]["megatron_args"]
    )
    _finish(loaded, "sweep", tmp_path)
