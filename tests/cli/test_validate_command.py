"""``blueprinting validate`` without and with a (fake) cost model."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from blueprinting.cli.main import main
from blueprinting.validation.published import PublishedRun


def test_without_cost_model_exits_2_with_a_message(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "blueprinting.api", None)
    assert main(["validate"]) == 2
    captured = capsys.readouterr()
    assert "error: the cost model is not available" in captured.err
    assert "Traceback" not in captured.err


class _Report:
    def __init__(self, run_id: str) -> None:
        self.run_id = run_id

    def to_json_dict(self) -> dict[str, object]:
        return {"iteration_time_s": 1.0}


@pytest.fixture
def fake_api(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    module = types.ModuleType("blueprinting.api")

    def plan_spec(spec: str, system: str, options: object = None) -> _Report:
        return _Report(spec)

    module.plan_spec = plan_spec  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "blueprinting.api", module)
    monkeypatch.setattr(PublishedRun, "training_spec", lambda self: self.id)
    yield


def test_with_a_cost_model_prints_gates_and_fails_them(
    fake_api: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["validate", "--summary-only"]) == 1
    out = capsys.readouterr().out
    assert "Accuracy gates" in out
    assert "FAIL" in out


def test_missing_fixture_exits_2(
    fake_api: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["validate", "--fixture", str(tmp_path / "none.toml")]) == 2
    assert "fixture not found" in capsys.readouterr().err


def test_json_prints_gates_rows_and_alternatives(
    fake_api: None, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    assert main(["validate", "--json"]) == 1
    document = json.loads(capsys.readouterr().out)
    assert document["passed"] is False
    assert [gate["passed"] for gate in document["gates"]] == [False, False, False]
    # Every time figure of the fake model is 1 s: Korthikanti's 1T full took 94.42 s.
    (row,) = [
        r
        for r in document["rows"]
        if r["run"] == "korthikanti2022_t5_1T_full" and r["metric"] == "iteration_time_s"
    ]
    assert row["measured"] == 94.42 and row["predicted"] == 1.0
    assert row["relative_error"] == (1.0 - 94.42) / 94.42
    assert row["gated"] is True
    alternatives = {(a["run"], a["metric"]) for a in document["alternatives"]}
    assert ("korthikanti2022_t5_1T_full", "iteration_time_s") in alternatives
    assert {a["label"] for a in document["alternatives"]} == {"v=2"}


def test_rows_view_lists_the_alternative_readings(
    fake_api: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["validate"]) == 1
    out = capsys.readouterr().out
    assert "Ambiguous sources" in out
    assert "korthikanti2022_t5_1T_seqsel" in out
    # the readings' labels print as written, not read as rich markup tags
    assert "korthikanti2022_t5_1T_seqsel [v=2]:" in out


def test_json_gains_the_memory_object(fake_api: None, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    assert main(["validate", "--json"]) == 1
    document = json.loads(capsys.readouterr().out)
    assert {"passed", "gates", "rows", "alternatives", "memory"} <= set(document)
    memory = document["memory"]
    assert memory["passed"] is False
    assert memory["excluded_runs"] == 6
    assert len(memory["rows"]) == 73
    # The fake report has no memory figures: every row is unpredicted, every gate fails.
    assert {row["note"] for row in memory["rows"]} == {"not predicted"}
    assert [gate["passed"] for gate in memory["gates"]] == [False, False, False]


def test_missing_memory_fixture_exits_2(
    fake_api: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["validate", "--memory-fixture", str(tmp_path / "none.toml")]) == 2
    assert "measured-memory fixture not found" in capsys.readouterr().err


def test_text_report_shows_the_memory_tables(
    fake_api: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["validate"]) == 1
    out = capsys.readouterr().out
    assert "Measured memory: measured vs predicted" in out
    assert "Memory gates (issue 19)" in out


def test_json_gains_the_modern_object(fake_api: None, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    assert main(["validate", "--json"]) == 1
    document = json.loads(capsys.readouterr().out)
    assert {"passed", "gates", "rows", "alternatives", "memory", "modern"} <= set(document)
    modern = document["modern"]
    assert len(modern["rows"]) == 79
    assert modern["planned_runs"] + modern["not_planned_runs"] == 79
    # The fake report says 1 s for every run it is handed; refused runs keep the planner's words.
    for row in modern["rows"]:
        if row["planned"]:
            assert row["predicted_iteration_time_s"] == 1.0
        else:
            assert row["predicted_iteration_time_s"] is None and row["not_planned"]
    assert [gate["name"] for gate in modern["gates"]] == [
        "iteration time: median |error| (planned rows)",
        "iteration time: max |error| (planned rows)",
        "every dense row planned",
    ]
    assert {(s["axis"], s["group"]) for s in modern["summaries"]} >= {
        ("generation", "hopper"),
        ("generation", "blackwell"),
        ("recipe", "fp8-tensorwise"),
        ("recipe", "mxfp8"),
        ("recipe", "nvfp4"),
    }


def test_text_report_shows_the_modern_tables(
    fake_api: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["validate"]) == 1
    out = capsys.readouterr().out
    assert "Modern dense runs: iteration time" in out
    assert "Modern dense-run gates (issue 12)" in out


def test_missing_modern_fixture_exits_2(
    fake_api: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["validate", "--modern-fixture", str(tmp_path / "none.toml")]) == 2
    assert "modern-runs fixture not found" in capsys.readouterr().err


def test_json_gains_the_moe_object(fake_api: None, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    assert main(["validate", "--json"]) == 1
    document = json.loads(capsys.readouterr().out)
    moe = document["moe"]
    assert len(moe["rows"]) == 65
    assert moe["planned_runs"] + moe["not_planned_runs"] == 65
    assert [gate["name"] for gate in moe["gates"]] == [
        "MoE iteration time: median |error| (planned rows)",
        "MoE iteration time: max |error| (planned rows)",
        "every MoE row planned",
    ]
    assert [gate["limit"] for gate in moe["gates"]] == [0.10, 0.25, 1.0]
    (row,) = [
        r
        for r in moe["rows"]
        if r["run"] == "mbridge_26.04.01_pretrain_deepseekv3_b200_n256_mxfp8_gbs4096"
    ]
    assert (row["t"], row["p"], row["cp"], row["ep"], row["etp"], row["vp"]) == (1, 8, 1, 32, 1, 2)
    assert row["dispatcher"] == "flex-deepep" and row["recipe"] == "mxfp8"
    assert {(s["axis"], s["group"]) for s in moe["summaries"]} >= {
        ("model", "deepseek-v3"),
        ("model", "mixtral-8x22b"),
        ("generation", "hopper"),
        ("dispatcher", "flex-hybridep"),
        ("dispatcher", "alltoall"),
    }


def test_text_report_shows_the_moe_tables(
    fake_api: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["validate"]) == 1
    out = capsys.readouterr().out
    assert "MoE runs: iteration time" in out
    assert "MoE-run gates (issue 13)" in out


def test_missing_moe_fixture_exits_2(
    fake_api: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["validate", "--moe-fixture", str(tmp_path / "none.toml")]) == 2
    assert "MoE-runs fixture not found" in capsys.readouterr().err
