"""Float-or-column dispatch: the few operations a cost formula needs beyond arithmetic.

The op cost rule (:func:`~blueprinting.synthesizer.stages.portable_plan.passes.work_time`, the
efficiency models, :class:`~blueprinting.hardware.system.SystemSpec`'s rates) is written once
over :data:`Real`: a Python ``float`` (one op: the plan) or a float64 numpy array (one column of
ops: decode attention over every KV length of a request, issue 18). Arithmetic operators work on
both; ``min`` / ``max``, a choice by condition, a table index and ``**`` do not, so each is one
function here that calls the builtin on floats (no numpy per-call overhead in the scalar plan)
and the numpy ufunc on arrays. A formula written with these gives, element by element, the
float of the scalar call: ``**`` on a column is Python's ``float.__pow__`` per element, because
numpy's vectorized ``power`` may round differently (its SIMD kernels on some CPUs).

The analysis formulas (memory, data-parallel exposure, P2P exposure, the bubble contract) are
written the same way over :data:`Number`, which adds Python ints (byte counts exact at any size
on the plan's path) and int64 columns (the vectorized search), with :func:`where` for a choice
by condition. In the cost rule, Python ints pass as floats (mypy's int-to-float promotion); a
column holds float64, so a caller that builds one from int counts keeps every count below 2**53
(exact in float64) for the two results to be equal (:func:`exact_column`).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final, TypeAlias, TypeVar, cast, overload

from blueprinting.errors import ConfigError

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

# numpy is imported only on a column's path: `check` and `presets` load the cost rule without it
# (the CLI's start-up time), so the column type is named by a string.
Column: TypeAlias = "npt.NDArray[np.float64]"
IntColumn: TypeAlias = "npt.NDArray[np.int64]"
Real = TypeVar("Real", float, Column)
#: Exact counts (FLOPs, bytes, blocks): Python ints on the plan's path, int64 columns in the
#: search.
Count = TypeVar("Count", int, IntColumn)
#: The analysis formulas' values (byte counts exact as Python ints on the plan's path, int64
#: columns in the search) as well as seconds.
Number = TypeVar("Number", int, float, IntColumn, Column)

# A tuple, not ``float | int``: isinstance builds no union object per call (the scalar plan's
# hot path).
_SCALAR: Final = (float, int)

#: Integers up to this are exact in float64 (53-bit significand).
EXACT_INT_LIMIT = 2**53


def exact_column(values: Sequence[int]) -> Column | None:
    """``values`` as a float64 column, or None when one is not exactly representable."""
    import numpy as np

    if values and not (min(values) >= -EXACT_INT_LIMIT and max(values) <= EXACT_INT_LIMIT):
        return None
    return np.array(values, dtype=np.float64)


@overload
def maximum(a: int, b: int) -> int: ...
@overload
def maximum(a: float, b: float) -> float: ...
@overload
def maximum(a: IntColumn, b: IntColumn | int) -> IntColumn: ...
@overload
def maximum(a: Column, b: Column | float) -> Column: ...
def maximum(a: Number, b: Number | float) -> Number | float:
    """``max`` on numbers (Python ints stay exact at any size), ``np.maximum`` on a column
    ``a`` (``b`` a number or a column)."""
    if isinstance(a, _SCALAR):
        return max(a, b)
    import numpy as np

    return cast("Number", np.maximum(a, b))


@overload
def minimum(a: int, b: int) -> int: ...
@overload
def minimum(a: float, b: float) -> float: ...
@overload
def minimum(a: IntColumn, b: IntColumn | int) -> IntColumn: ...
@overload
def minimum(a: Column, b: Column | float) -> Column: ...
def minimum(a: Number, b: Number | float) -> Number | float:
    """``min`` on numbers, ``np.minimum`` on a column ``a`` (``b`` a number or a column)."""
    if isinstance(a, _SCALAR):
        return min(a, b)
    import numpy as np

    return cast("Number", np.minimum(a, b))


def where(condition: bool | npt.NDArray[np.bool_], if_true: Number, if_false: Number) -> Number:
    """``if_true`` where ``condition`` holds, else ``if_false``: Python's conditional on a plan's
    values, :func:`numpy.where` on a column's (the analysis formulas written once on either:
    memory, data-parallel exposure, the bubble contract)."""
    if isinstance(condition, bool):
        return if_true if condition else if_false
    import numpy as np

    return cast("Number", np.where(condition, if_true, if_false))


def power(base: Real, exponent: float) -> Real:
    """``base ** exponent``, per element on a column (module docstring)."""
    if isinstance(base, _SCALAR):
        # float ** float is typed Any (a negative base gives a complex); bases here are >= 0.
        result: float = base**exponent
        return result
    import numpy as np

    return np.array([b**exponent for b in base.tolist()], dtype=np.float64)


def log2(x: Real) -> Real:
    """``math.log2``, per element on a column (as :func:`power`)."""
    if isinstance(x, _SCALAR):
        return math.log2(x)
    import numpy as np

    return np.array([math.log2(v) for v in x.tolist()], dtype=np.float64)


def any_below(x: Real, bound: float) -> bool:
    """Whether ``x`` (any element of it) is below ``bound`` or NaN."""
    if isinstance(x, _SCALAR):
        return not x >= bound
    import numpy as np

    return not bool(np.all(x >= bound))


def all_equal(x: Real, value: float) -> bool:
    """Whether ``x`` (every element of it) equals ``value``."""
    if isinstance(x, _SCALAR):
        return x == value
    import numpy as np

    return bool(np.all(x == value))


def nonzero_sizes(x: Real, must: str) -> Real | None:
    """A size (FLOPs, bytes) checked for a rate formula: None when it is 0 (every element),
    else ``x`` with any zero element replaced by 1 (:func:`positive_or_one`). A negative or NaN
    size is a ``ConfigError`` ``"{must}, got {x!r}"``."""
    if isinstance(x, _SCALAR):
        if not x >= 0:
            raise ConfigError([f"{must}, got {x!r}"])
        return None if x == 0 else x
    import numpy as np

    if not bool(np.all(x >= 0)):
        raise ConfigError([f"{must}, got {x!r}"])
    return None if not bool(np.any(x)) else np.where(x > 0, x, 1.0)


def positive_or_one(x: Real) -> Real:
    """``x`` where it is positive, else 1: a divisor safe to evaluate a formula on, whose value
    at the replaced elements :func:`where_positive` then discards."""
    if isinstance(x, _SCALAR):
        return x if x > 0 else 1.0
    import numpy as np

    return np.where(x > 0, x, 1.0)


def where_positive(x: Real, value: Real, otherwise: float) -> Real:
    """``value`` where ``x > 0``, else ``otherwise``."""
    if isinstance(x, _SCALAR):
        return value if x > 0 else otherwise
    import numpy as np

    return np.where(x > 0, value, otherwise)


def zeros_like(x: Real) -> Real:
    """0.0, or a column of zeros shaped like ``x``."""
    if isinstance(x, _SCALAR):
        return 0.0
    import numpy as np

    return np.zeros_like(x)


def ones_like(x: Real) -> Real:
    """1.0, or a column of ones shaped like ``x``."""
    if isinstance(x, _SCALAR):
        return 1.0
    import numpy as np

    return np.ones_like(x)


def step_index(thresholds: Sequence[float], x: Real) -> Real:
    """The number of ``thresholds`` (increasing) at or below ``x`` (``bisect_right``)."""
    if isinstance(x, _SCALAR):
        return float(bisect_right(thresholds, x))
    import numpy as np

    return np.searchsorted(np.asarray(thresholds), x, side="right").astype(np.float64)


def take(table: Sequence[float], index: Real) -> Real:
    """``table[index]`` (``index`` a whole number, a float or a column of them)."""
    if isinstance(index, _SCALAR):
        return table[int(index)]
    import numpy as np

    return np.asarray(table, dtype=np.float64)[index.astype(np.intp)]
