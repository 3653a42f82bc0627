"""Arithmetic on a plan's numbers or on the search's columns of them.

The scalar plan (``analysis/*``) evaluates a cost or memory formula on Python numbers (its
integers exact at any size); the vectorized search (``search/evaluate_vectorized.py``) evaluates
the same function on numpy columns, one row per candidate. Operators already work on both; what
does not (a conditional, ``min``, ``max``) goes through these, which keep Python's own operation
on plain numbers (no numpy call on the plan's path) and take numpy's on arrays. So each formula
is written once, and the two callers differ only in how they pick a variant: a ``match`` on the
spec's sum type, or ``numpy.select`` over the rows' variant codes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar, cast

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

Number = TypeVar("Number", int, float, "npt.NDArray[np.int64]", "npt.NDArray[np.float64]")


def _plain(*values: object) -> bool:
    return all(isinstance(value, int | float) for value in values)


def where(condition: bool | npt.NDArray[np.bool_], if_true: Number, if_false: Number) -> Number:
    """``if_true`` where ``condition`` holds, else ``if_false``."""
    if isinstance(condition, bool):
        return if_true if condition else if_false
    import numpy as np

    return cast("Number", np.where(condition, if_true, if_false))


def minimum(a: Number, b: Number) -> Number:
    """The smaller of ``a`` and ``b`` (element-wise on columns)."""
    if _plain(a, b):
        return a if a <= b else b
    import numpy as np

    return cast("Number", np.minimum(a, b))


def maximum(a: Number, b: Number) -> Number:
    """The larger of ``a`` and ``b`` (element-wise on columns); ``a`` on a tie, as ``max``."""
    if _plain(a, b):
        return a if a >= b else b
    import numpy as np

    return cast("Number", np.maximum(a, b))
