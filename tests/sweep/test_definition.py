"""The sweep definition: grid order, flags over the file, and validation that reports every
problem at once before any Ray start."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from blueprinting.cli.main import main
from blueprinting.errors import ConfigError
from blueprinting.sweep.definition import Cell, definition_from_mapping

BAD_SWEEP = """\
model = ["gpt3-175b", "llama3-70", "gpt3-175b"]
system = []
gpus = [64, -8, 0]
global_batch = 1536
train_tokenz = 5
[price]
dgx-h100 = 2.5
"""


def test_cells_in_grid_order_with_preset_lengths() -> None:
    definition = definition_from_mapping(
        {
            "model": ["gpt-1.7b", "llama2-7b"],
            "system": ["dgx-h100"],
            "gpus": [8, 16],
            "global_batch": 64,
            "price": {"dgx-h100": 2},
        },
        source="test",
    )
    assert definition.cells() == (
        Cell(model="gpt-1.7b", system="dgx-h100", gpus=8, global_batch=64, seq_length=2048),
        Cell(model="gpt-1.7b", system="dgx-h100", gpus=16, global_batch=64, seq_length=2048),
        Cell(model="llama2-7b", system="dgx-h100", gpus=8, global_batch=64, seq_length=4096),
        Cell(model="llama2-7b", system="dgx-h100", gpus=16, global_batch=64, seq_length=4096),
    )
    assert definition.price("dgx-h100") == 2.0
    assert definition.price("dgx-b200") is None
    assert definition.options.train_tokens == 300_000_000_000


def test_listed_lengths_replace_the_presets() -> None:
    definition = definition_from_mapping(
        {
            "model": ["llama2-7b"],
            "system": ["dgx-h100"],
            "gpus": [8],
            "global_batch": [64],
            "seq_length": [1024, 2048],
        },
        source="test",
    )
    assert [c.seq_length for c in definition.cells()] == [1024, 2048]


def test_every_problem_of_a_bad_file_at_once() -> None:
    with pytest.raises(ConfigError) as caught:
        definition_from_mapping(
            {
                "model": ["gpt3-175b", "llama3-70", "gpt3-175b"],
                "system": [],
                "gpus": [64, -8, 0],
                "global_batch": 1536,
                "train_tokenz": 5,
                "price": {"dgx-h100": 2.5},
            },
            source="SWEEP.toml",
        )
    assert caught.value.problems == (
        "unknown key 'train_tokenz' (did you mean 'train_tokens'?)",
        "model[1]: unknown model 'llama3-70' (did you mean 'llama3-70b'?)",
        "model lists 'gpt3-175b' more than once",
        "system must not be an empty list",
        "gpus[1] must be a positive integer, got -8",
        "gpus[2] must be a positive integer, got 0",
        "price['dgx-h100']: 'dgx-h100' is not a system of the sweep",
    )


def test_a_cell_over_the_search_limit_is_refused_up_front() -> None:
    # 2**20 GPUs (78 (t, p) pairs), 45 (v, overlap) rows of 96 layers, 240 divisors of the
    # batch 720,720, 2 sp x 3 recompute: 5,054,400 rows by divisor counts alone (space_rows),
    # over MAX_SEARCH_ROWS before anything is enumerated.
    with pytest.raises(ConfigError) as caught:
        definition_from_mapping(
            {
                "model": ["gpt3-175b"],
                "system": ["dgx-h100"],
                "gpus": [2**20],
                "global_batch": [720_720],
            },
            source="test",
        )
    assert caught.value.problems == (
        "cell gpt3-175b dgx-h100 N=1048576 B=720720: the search space has 5,054,400 "
        "law-relevant rows, over the limit of 4,000,000 (MAX_SEARCH_ROWS); set max_micro_batch "
        "or choose a GPU count or batch with fewer divisors",
    )


def test_bad_sweep_file_exits_2_with_every_problem_and_starts_no_ray(tmp_path: Path) -> None:
    sweep = tmp_path / "SWEEP.toml"
    sweep.write_text(BAD_SWEEP, encoding="utf-8")
    # A fresh interpreter, so that "ray was never imported" is a fact about this command only.
    script = (
        "import sys\n"
        "from blueprinting.cli.main import main\n"
        f"code = main(['sweep', {str(sweep)!r}, '--out', {str(tmp_path / 'out')!r},"
        " '--plot', 'x.pdf'])\n"
        "print(code, 'ray' in sys.modules, 'pyarrow' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.split() == ["2", "False", "False"]
    assert done.stderr == (
        f"invalid configuration in {sweep}:\n"
        "  - --plot 'x.pdf': the figure is written as .png or .svg\n"
        "  - unknown key 'train_tokenz' (did you mean 'train_tokens'?)\n"
        "  - model[1]: unknown model 'llama3-70' (did you mean 'llama3-70b'?)\n"
        "  - model lists 'gpt3-175b' more than once\n"
        "  - system must not be an empty list\n"
        "  - gpus[1] must be a positive integer, got -8\n"
        "  - gpus[2] must be a positive integer, got 0\n"
        "  - price['dgx-h100']: 'dgx-h100' is not a system of the sweep\n"
    )
    assert not (tmp_path / "out").exists()


def test_flags_replace_the_file_lists_and_add_prices(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sweep = tmp_path / "SWEEP.toml"
    sweep.write_text(BAD_SWEEP, encoding="utf-8")
    code = main(
        [
            "sweep",
            str(sweep),
            "--model",
            "gpt-1.7b",
            "--system",
            "dgx-h100",
            "--gpus",
            "8",
            "--gpus",
            "16",
            "--price",
            "dgx-h100=abc",
            "--price",
            "nope",
            "--workers",
            "0",
            "--out",
            str(tmp_path / "out"),
        ]
    )
    assert code == 2
    assert capsys.readouterr().err == (
        f"invalid configuration in {sweep}:\n"
        "  - --price 'dgx-h100=abc': 'abc' is not a number\n"
        "  - --price 'nope': expected SYSTEM=USD_PER_GPU_HOUR (e.g. dgx-h100=2.5)\n"
        "  - --workers must be >= 1, got 0\n"
        "  - unknown key 'train_tokenz' (did you mean 'train_tokens'?)\n"
    )


def test_cost_plot_needs_every_price(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "sweep",
            "--model",
            "gpt-1.7b",
            "--system",
            "dgx-h100",
            "dgx-b200",
            "--gpus",
            "8",
            "--global-batch",
            "64",
            "--price",
            "dgx-h100=2.5",
            "--plot",
            "f.svg",
            "--plot-metric",
            "cost",
            "--out",
            str(tmp_path / "out"),
        ]
    )
    assert code == 2
    assert capsys.readouterr().err == (
        "invalid configuration in sweep:\n"
        "  - --plot-metric cost needs a --price for every system; none for ['dgx-b200']\n"
    )


def test_the_readme_example_file_is_valid() -> None:
    from blueprinting.sweep.definition import read_sweep_file

    root = Path(__file__).resolve().parents[2]
    data = read_sweep_file(root / "examples" / "SWEEP.toml")
    definition = definition_from_mapping(data, source="examples/SWEEP.toml")
    assert len(definition.models) >= 4
    assert len(definition.systems) >= 3
    assert len(definition.gpus) >= 5
    assert json.dumps(definition.options.to_json())  # what the output folder records


def test_html_in_a_missing_folder_is_refused_before_the_sweep(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page = tmp_path / "missing" / "sweep.html"
    args = ["sweep", "--model", "gpt-1.7b", "--system", "dgx-h100", "--gpus", "8"]
    code = main(
        [*args, "--global-batch", "16", "--out", str(tmp_path / "out"), "--html", str(page)]
    )
    assert code == 2
    assert capsys.readouterr().err == (
        "invalid configuration in sweep:\n"
        f"  - --html {page}: cannot write the file: folder {str(page.parent)!r} does not exist\n"
    )
    assert not (tmp_path / "out").exists()


def test_precision_recipes_every_cell_searches() -> None:
    """``precision`` is the search's ``--precision`` for every cell: a recipe a listed system
    cannot run is refused before anything runs; the best strategy names its recipe."""
    from blueprinting.sweep.cell import BestStrategy, evaluate_cell

    base = {"model": ["llama3-8b"], "gpus": [8], "global_batch": [8], "max_micro_batch": 1}
    with pytest.raises(ConfigError) as error:
        definition_from_mapping(
            {**base, "system": ["dgx-h100", "dgx-b200"], "precision": ["mxfp8", "fp9"]},
            source="test",
        )
    assert error.value.problems == (
        "precision: unknown recipe 'fp9'; recipes: bf16, fp16, fp8-delayed, fp8-tensorwise, "
        "fp8-blockwise, mxfp8, nvfp4",
    )
    with pytest.raises(ConfigError) as error:
        definition_from_mapping(
            {**base, "system": ["dgx-h100", "dgx-b200"], "precision": ["mxfp8"]}, source="test"
        )
    (problem,) = error.value.problems
    assert problem.startswith("precision mxfp8 on dgx-h100: fp8_recipe = mxfp8 needs mxfp8 GEMMs")
    definition = definition_from_mapping(
        {**base, "system": ["dgx-h100"], "precision": ["bf16", "fp8-tensorwise"]}, source="test"
    )
    (cell,) = definition.cells()
    row = evaluate_cell(cell, definition.options)
    assert isinstance(row.outcome, BestStrategy)
    assert "precision=fp8-tensorwise" in row.outcome.strategy_text


def test_pipeline_layouts_every_cell_searches() -> None:
    """``pipeline_layouts`` is the search's ``--pipeline-layouts`` for every cell: ``balanced``
    adds the (p, v) DeepSeek-V2-Lite's 27 layers do not split over; the manifest names it only
    when it is not the default, so a folder of an earlier version resumes under ``even``."""
    from blueprinting.sweep.cell import evaluate_cell

    base = {
        "model": ["deepseek-v2-lite"],
        "system": ["dgx-h100"],
        "gpus": [16],
        "global_batch": [32],
        "max_micro_batch": 1,
    }
    with pytest.raises(ConfigError) as error:
        definition_from_mapping({**base, "pipeline_layouts": "balance"}, source="test")
    assert error.value.problems == (
        "pipeline_layouts: 'balance' is not one of even, balanced (did you mean 'balanced'?)",
    )
    even = definition_from_mapping(base, source="test")
    balanced = definition_from_mapping({**base, "pipeline_layouts": "balanced"}, source="test")
    assert "pipeline_layouts" not in even.options.to_json()
    assert balanced.options.to_json()["pipeline_layouts"] == "balanced"
    (cell,) = even.cells()
    rows = [evaluate_cell(cell, d.options) for d in (even, balanced)]
    assert rows[1].candidates_valid > rows[0].candidates_valid > 0
