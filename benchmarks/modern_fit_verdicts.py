"""Fit verdicts on the measured modern runs (``validation/fit_verdicts.py``): how many of the runs
in ``modern_runs.toml`` and ``modern_moe_runs.toml`` plan, how many are predicted to fit (every
one ran), and for each that is not, the predicted reserved peak against the capacity. The test
``tests/validation/test_fit_verdicts.py`` holds the gate.

Run: ``.venv/bin/python benchmarks/modern_fit_verdicts.py``.
"""

from __future__ import annotations

from blueprinting.validation.fit_verdicts import modern_fit_verdicts

GIB = 2**30


def main() -> int:
    verdicts = modern_fit_verdicts()
    print(f"{verdicts.fit} of {verdicts.planned} planned runs that ran are predicted to fit")
    for miss in verdicts.misses:
        print(
            f"  {miss.run_id}: {miss.reserved_peak_bytes / GIB:.1f} GiB reserved peak > "
            f"{miss.capacity_bytes / GIB:.1f} GiB"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
