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

    def plan_spec(spec: str, system: str) -> _Report:
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
