"""Fit verdicts on the measured modern runs: every run in ``modern_runs.toml`` and
``modern_moe_runs.toml`` ran, so each should be predicted to fit (issue 19's "will it fit?" on
the recipes users copy). These fixtures carry no measured memory, so this is a verdict count,
not a memory-error gate; it prints how many plan, how many are predicted to fit, and for each
that is not, the predicted reserved peak against the capacity.

Run: ``.venv/bin/python benchmarks/modern_fit_verdicts.py``.
"""

from __future__ import annotations

from blueprinting.errors import BlueprintingError
from blueprinting.validation.modern import load_modern_runs
from blueprinting.validation.modern_moe import load_moe_runs
from blueprinting.validation.predictor import PlanCache

GIB = 2**30


def main() -> int:
    cache = PlanCache()
    planned = fit = 0
    misses: list[tuple[str, float, float]] = []
    for run in (*load_modern_runs(), *load_moe_runs()):
        try:
            values = cache.values(
                run.training_spec(), run.system, megatron_rules=not run.waived_megatron_rules
            )
        except BlueprintingError:
            continue  # not planned: validate says why
        planned += 1
        memory = values.get("memory_bytes")
        if values.get("fits_in_memory") is True:
            fit += 1
        elif isinstance(memory, dict):
            misses.append(
                (run.id, float(memory["reserved_peak"]) / GIB, float(memory["capacity"]) / GIB)
            )
    print(f"{fit} of {planned} planned runs that ran are predicted to fit")
    for run_id, peak, capacity in misses:
        print(f"  {run_id}: {peak:.1f} GiB reserved peak > {capacity:.1f} GiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
