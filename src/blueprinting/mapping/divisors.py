"""Divisors by factorization: the degrees an axis of size ``n`` can split into.

The searches enumerate t, p, v and micro-batch sizes over divisors of user numbers (GPU counts,
layer counts, batch sizes) that may be as large as ``2**63 - 1``; trial division up to ``n``
would take years there. ``factorize`` strips small primes by trial division, proves the rest
prime with a Miller-Rabin test that is deterministic below ``3.3 * 10**24`` (the first 13 prime
bases, Sorenson and Webster 2015) and splits composites with Pollard's rho (Brent's variant);
``divisors`` builds the sorted divisor list from the prime powers. Every ``n < 2**63`` answers
in milliseconds.
"""

from __future__ import annotations

from functools import lru_cache
from math import gcd, isqrt

_SMALL_PRIMES: tuple[int, ...] = tuple(
    k for k in range(2, 1000) if all(k % q for q in range(2, isqrt(k) + 1))
)
# Deterministic Miller-Rabin witnesses for every n < 3,317,044,064,679,887,385,961,981.
_WITNESSES: tuple[int, ...] = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41)


def is_prime(n: int) -> bool:
    """Whether ``n`` is prime (exact for every ``n < 3.3 * 10**24``)."""
    if n < 2:
        return False
    for q in _SMALL_PRIMES[:13]:
        if n % q == 0:
            return n == q
    d, s = n - 1, 0
    while d % 2 == 0:
        d //= 2
        s += 1
    for a in _WITNESSES:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def _rho(n: int) -> int:
    """A non-trivial factor of the odd composite ``n`` (Pollard's rho, Brent's cycle finding)."""
    c = 1
    while True:
        y, r, q, g = 2, 1, 1, 1
        x = ys = y
        while g == 1:
            x = y
            for _ in range(r):
                y = (y * y + c) % n
            k = 0
            while k < r and g == 1:
                ys = y
                for _ in range(min(128, r - k)):
                    y = (y * y + c) % n
                    q = q * abs(x - y) % n
                g = gcd(q, n)
                k += 128
            r *= 2
        if g == n:
            g = 1
            while g == 1:
                ys = (ys * ys + c) % n
                g = gcd(abs(x - ys), n)
        if g != n:
            return g
        c += 1


def factorize(n: int) -> dict[int, int]:
    """The prime factorization of ``n >= 1`` as ``{prime: exponent}`` (empty for 1)."""
    if n < 1:
        raise ValueError(f"factorize needs n >= 1, got {n}")
    return dict(_factors(n))


@lru_cache(maxsize=4096)
def _factors(n: int) -> tuple[tuple[int, int], ...]:
    """:func:`factorize` as pairs, kept: a sweep sizes the spaces of up to 10^6 cells, whose GPU
    counts and batches repeat (issue #18)."""
    factors: dict[int, int] = {}
    for q in _SMALL_PRIMES:
        if q * q > n:
            break
        while n % q == 0:
            factors[q] = factors.get(q, 0) + 1
            n //= q
    pending = [n] if n > 1 else []
    while pending:
        m = pending.pop()
        if is_prime(m):
            factors[m] = factors.get(m, 0) + 1
            continue
        root = isqrt(m)
        if root * root == m:
            pending.extend((root, root))
            continue
        f = _rho(m)
        pending.extend((f, m // f))
    return tuple(factors.items())


def divisor_count(n: int) -> int:
    """How many divisors ``n >= 1`` has, without listing them."""
    if n < 1:
        raise ValueError(f"factorize needs n >= 1, got {n}")
    count = 1
    for _, exponent in _factors(n):
        count *= exponent + 1
    return count


def divisors(n: int) -> list[int]:
    """The divisors of ``n >= 1`` in increasing order."""
    if n < 1:
        raise ValueError(f"factorize needs n >= 1, got {n}")
    out = [1]
    for prime, exponent in _factors(n):
        out = [d * prime**k for d in out for k in range(exponent + 1)]
    return sorted(out)
