"""Small strategies the HTML report tests render (fast: a 1.7B model, a few microbatches)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from blueprinting.cli.main import main

#: gpt-1.7b, TP2 PP4 v2 DP2, 8 microbatches: an interleaved schedule of 400-odd commands.
PLAN_ARGS = (
    "--model",
    "gpt-1.7b",
    "--gpus",
    "16",
    "--set",
    "tensor_model_parallel_size=2",
    "--set",
    "pipeline_model_parallel_size=4",
    "--set",
    "num_virtual_stages_per_pipeline_rank=2",
    "--set",
    "global_batch_size=16",
    "--set",
    "micro_batch_size=1",
)
SEARCH_ARGS = ("--model", "gpt-1.7b", "--gpus", "16", "--global-batch", "64", "--top", "5")


def run_with_html(
    capsys: pytest.CaptureFixture[str], command: str, args: tuple[str, ...], out: Path
) -> dict[str, Any]:
    """Run ``command ARGS --json --html OUT`` and return the JSON it printed: the page and the
    JSON come from one run, so they must agree exactly."""
    code = main([command, *args, "--json", "--html", str(out)])
    assert code == 0
    document = json.loads(capsys.readouterr().out)
    assert isinstance(document, dict)
    return document


def embedded_json(page: str) -> object:
    """The ``<script id="report-json">`` object of a page."""
    found = re.search(r'<script type="application/json" id="report-json">(.*?)</script>', page)
    assert found is not None
    return json.loads(found.group(1))


def without_plotly(page: str) -> str:
    """The page less the inlined Plotly bundle (whose code holds attribution URLs of map tiles
    that a page without maps never loads)."""
    head, _, rest = page.partition("<script>\n")
    _, _, tail = rest.partition("\n</script>\n</head>")
    assert tail, "the Plotly bundle is the first script of the head"
    return head + tail
