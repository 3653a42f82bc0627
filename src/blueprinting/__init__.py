"""Blueprinting: plan Megatron-style parallel strategies for transformers before running them.

``blueprinting.plan(...)`` is :func:`blueprinting.api.plan`; it is imported on first use so that
importing the package (and starting the CLI) stays fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

__version__ = "0.1.0"

if TYPE_CHECKING:
    from blueprinting.api import plan as plan


def __getattr__(name: str) -> object:
    if name == "plan":
        from blueprinting.api import plan

        return plan
    raise AttributeError(f"module 'blueprinting' has no attribute {name!r}")
