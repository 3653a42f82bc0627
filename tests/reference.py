"""Where the shared reference data (``shared/reference``) is, for tests that compare with it."""

from __future__ import annotations

import os
from pathlib import Path


def shared_reference() -> Path | None:
    """``$BLUEPRINTING_SHARED/reference``, else ``shared/reference`` beside an ancestor of the
    tests, when it holds ``published_runs.json``; ``None`` on a clone without it."""
    env = os.environ.get("BLUEPRINTING_SHARED")
    candidates = [Path(env)] if env else []
    candidates += [parent / "shared" for parent in Path(__file__).resolve().parents]
    for candidate in candidates:
        if (candidate / "reference" / "published_runs.json").is_file():
            return candidate / "reference"
    return None
