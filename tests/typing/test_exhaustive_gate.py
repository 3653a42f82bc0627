"""The exhaustive-match gate (seed: "Adding a schedule constructor makes omitted interpreters and
lowerings visible to the mypy exhaustive-match gate"): mypy with the project's configuration must
reject a match that omits a PipelineSchedule variant and accept one that covers them all."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CASES = Path(__file__).resolve().parent / "cases"


def _mypy(case: str, cache: Path) -> subprocess.CompletedProcess[str]:
    # Explicit file arguments override the config's `files`; the config's `exclude` only affects
    # discovery, so the case is checked with every flag of [tool.mypy].
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(REPO / "pyproject.toml"),
            "--cache-dir",
            str(cache),
            "--no-error-summary",
            str(CASES / case),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


@pytest.fixture(scope="module")
def mypy_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mypy-cache")


def test_mypy_rejects_a_match_missing_a_schedule_variant(mypy_cache: Path) -> None:
    result = _mypy("missing_schedule_variant.py", mypy_cache)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Match statement has unhandled case" in result.stdout, result.stdout
    assert "ForwardOnly" in result.stdout, result.stdout
    assert "[exhaustive-match]" in result.stdout, result.stdout


def test_mypy_rejects_the_missing_variant_at_the_assert_never_catch_all(mypy_cache: Path) -> None:
    result = _mypy("missing_schedule_variant_assert_never.py", mypy_cache)
    assert result.returncode == 1, result.stdout + result.stderr
    assert (
        'Argument 1 to "assert_never" has incompatible type "ForwardOnly"; expected "Never"'
        in result.stdout
    ), result.stdout


def test_mypy_accepts_the_exhaustive_positive_control(mypy_cache: Path) -> None:
    result = _mypy("exhaustive_schedule_match.py", mypy_cache)
    assert result.returncode == 0, result.stdout + result.stderr
