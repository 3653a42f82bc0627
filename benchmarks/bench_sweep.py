"""Cells per second of ``blueprinting sweep`` on a local Ray instance with 1 and 2 workers
(issue 16).

Run: ``.venv/bin/python benchmarks/bench_sweep.py``.

For each worker count: a Ray instance with that many CPUs is started (its start time printed
apart), a warm-up sweep of one cell per worker imports blueprinting in every worker process,
then the timed sweep runs: 3 models x 2 systems x 4 GPU counts = 24 cells, each a full search
(the README's example models at smaller GPU counts, max micro-batch 8), into a fresh folder.
cells/s = 24 / the timed sweep's wall time (driver, tasks, Parquet parts and the final files).
For scale, the same 24 cells evaluated one after another in this process, without Ray
(``evaluate_cell``), are timed first. The speed-up from 1 to 2 workers is bounded by the machine's
cores (two on CI, shared with other work: the load average is printed).
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from blueprinting.sweep.definition import definition_from_mapping
from blueprinting.sweep.engine import LocalRay
from blueprinting.sweep.runner import run_sweep

GRID: dict[str, object] = {
    "model": ["gpt3-175b", "llama3-8b", "llama3-70b"],
    "system": ["dgx-a100-80gb", "dgx-h100"],
    "gpus": [64, 128, 256, 512],
    "global_batch": [512],
    "max_micro_batch": 8,
}
WARM_UP: dict[str, object] = {**GRID, "model": ["llama3-8b"], "system": ["dgx-h100"]}


def main() -> None:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray

    from blueprinting.sweep.cell import evaluate_cell
    from blueprinting.sweep.engine import OBJECT_STORE_BYTES

    definition = definition_from_mapping(GRID, source="bench")
    cells = len(definition.cells())
    print(f"sweep of {cells} cells: {GRID}; load average {os.getloadavg()[0]:.2f}")
    evaluate_cell(definition.cells()[0], definition.options)  # imports, caches
    start = time.perf_counter()
    for cell in definition.cells():
        evaluate_cell(cell, definition.options)
    alone = time.perf_counter() - start
    print(f"  in process, no Ray: {cells / alone:.2f} cells/s ({alone:.1f} s)")
    for workers in (1, 2):
        start = time.perf_counter()
        ray.init(
            num_cpus=workers,
            include_dashboard=False,
            object_store_memory=OBJECT_STORE_BYTES,
            log_to_driver=False,
        )
        started = time.perf_counter() - start
        try:
            with tempfile.TemporaryDirectory() as scratch:
                warm = {**WARM_UP, "gpus": list(definition.gpus[:workers])}
                warm_definition = definition_from_mapping(warm, source="bench")
                run_sweep(warm_definition, Path(scratch) / "warm", LocalRay(workers=workers))
                outcome = run_sweep(definition, Path(scratch) / "out", LocalRay(workers=workers))
        finally:
            ray.shutdown()
        assert outcome.computed_cells == cells
        print(
            f"  {workers} worker(s): {cells / outcome.seconds:.2f} cells/s "
            f"({outcome.seconds:.1f} s for {cells} cells; Ray start {started:.1f} s)"
        )


if __name__ == "__main__":
    main()
