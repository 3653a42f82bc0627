"""Time one full `plan` evaluation of GPT-3 175B (issue 4 target: < 100 us median).

Prints the median in-process time of `blueprinting.api.plan_spec` (laws, derivation, costing,
iteration analysis, memory for every stage, FLOPs, report) in two regimes:

- cold: the block-level memo caches are cleared before every call (a never-seen configuration);
- warm: a configuration whose local TP block (model, TP variant, recompute, micro batch, system)
  was seen before, as in a search or a sweep over PP/DP/batch; everything else is recomputed;
- default: `plan`'s default options, which also simulate the concrete schedule.

The first two use the analytic report (`PlanOptions(simulate=False)`, contract bubble).

Run: .venv/bin/python benchmarks/bench_plan.py
"""

from __future__ import annotations

import statistics
import time

from blueprinting.analysis import evaluate
from blueprinting.analysis.evaluate import PlanOptions
from blueprinting.analysis.iteration import BubbleSource
from blueprinting.api import build_spec, plan_spec
from blueprinting.hardware.presets import system_preset

SETTINGS = {
    "tensor_model_parallel_size": 8,
    "pipeline_model_parallel_size": 8,
    "num_virtual_stages_per_pipeline_rank": 3,
    "sequence_parallel": True,
    "recompute_granularity": "selective",
    "use_distributed_optimizer": True,
    "global_batch_size": 1536,
}


def _median_us(fn: object, repeats: int) -> float:
    assert callable(fn)
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e6


def main() -> None:
    spec = build_spec(model="gpt3-175b", gpus=1024, settings=SETTINGS)
    system = system_preset("dgx-a100-80gb")

    analytic = PlanOptions(bubble_source=BubbleSource.CONTRACT, simulate=False)

    def cold() -> None:
        evaluate._local_block.cache_clear()
        evaluate._local_block_costs.cache_clear()
        plan_spec(spec, system, analytic)

    def warm() -> None:
        plan_spec(spec, system, analytic)

    def simulated() -> None:
        plan_spec(spec, system)

    warm()
    print(f"GPT-3 175B, TP8 PP8 v3 DP16, SP + selective, dist-opt, on {system.name}")
    print(f"analytic, cold (block derived and costed): median {_median_us(cold, 50):9.1f} us")
    print(f"analytic, warm (block memoized):           median {_median_us(warm, 500):9.1f} us")
    print(f"default (+ simulated schedule, 9k cmds):  median {_median_us(simulated, 20):9.1f} us")


if __name__ == "__main__":
    main()
