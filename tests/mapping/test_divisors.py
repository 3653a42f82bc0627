"""Divisors by factorization (issue #18): exact against trial division, fast at 2**63 - 1."""

from __future__ import annotations

import math
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from blueprinting.mapping.divisors import divisor_count, divisors, factorize, is_prime


def _by_trial(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


@given(st.integers(min_value=1, max_value=20_000))
def test_divisors_match_trial_division(n: int) -> None:
    assert divisors(n) == _by_trial(n)
    assert divisor_count(n) == len(_by_trial(n))


@given(st.integers(min_value=1, max_value=2**63 - 1))
def test_factorization_multiplies_back_into_primes(n: int) -> None:
    factors = factorize(n)
    assert math.prod(p**e for p, e in factors.items()) == n
    assert all(is_prime(p) for p in factors)


@pytest.mark.parametrize(
    ("n", "factors", "count"),
    [
        (2**63 - 1, {7: 2, 73: 1, 127: 1, 337: 1, 92737: 1, 649657: 1}, 96),
        (99_999_999_999, {3: 2, 21649: 1, 513239: 1}, 12),
        (2**62, {2: 62}, 63),
        (2**61 - 1, {2**61 - 1: 1}, 2),  # a Mersenne prime
        ((2**31 - 1) * (2**31 - 19), {2**31 - 19: 1, 2**31 - 1: 1}, 4),  # two large primes
        (
            9_316_358_251_200,
            {2: 6, 3: 3, 5: 2, 7: 1, 11: 1, 13: 1, 17: 1, 19: 1, 23: 1, 29: 1},
            10752,
        ),
        (1, {}, 1),
    ],
)
def test_large_numbers_factor_at_once(n: int, factors: dict[int, int], count: int) -> None:
    start = time.perf_counter()
    assert factorize(n) == factors
    listed = divisors(n)
    assert len(listed) == count == divisor_count(n)
    assert listed[0] == 1
    assert listed[-1] == n
    assert listed == sorted(set(listed))
    assert time.perf_counter() - start < 1.0


def test_factorize_refuses_non_positive() -> None:
    with pytest.raises(ValueError, match="factorize needs n >= 1, got 0"):
        factorize(0)


def test_a_kept_factorization_is_not_shared_with_callers() -> None:
    """The factorizations are cached (a sweep sizes up to 10^6 spaces): a caller that edits
    the dict it got must not change the next answer."""
    first = factorize(1536)
    assert first == {2: 9, 3: 1}
    first[5] = 7
    assert factorize(1536) == {2: 9, 3: 1}
    assert divisor_count(1536) == 20
    assert divisors(12) == [1, 2, 3, 4, 6, 12]
