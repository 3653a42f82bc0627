"""Time the MoE search (issue 13 item 5): ``blueprinting search --model deepseek-v3 --system
dgx-gb200 --gpus 256 --global-batch 2048`` with ep, etp and the dispatcher in the space.

Run: ``OMP_NUM_THREADS=1 taskset -c 0 .venv/bin/python benchmarks/bench_search_moe.py`` (one core).

Two spaces, each printed as enumerated / lawful / fit / seconds (enumeration + vectorized
evaluation + ranking):

1. the command's default space (ep over every divisor of the 256 experts, etp 1, alltoall).
   Target: under 10 s on one core;
2. a wider one: etp in {1, 2}, dispatchers alltoall and flex-deepep (with and without the EP
   overlap), for the cost of each added axis;
3. balanced pipeline layouts (``--pipeline-layouts balanced --max-micro-batch 2``): p > 1 with
   the layouts the 61 layers need, v up to 8.

Measured (issue 18, two-core machine under a load of about 1, back to back): 0.67 s and 3.5 s
(0.95 s and 5.7 s before the MoE block was lowered in spans and the costing loop ran with the
collector paused).

DeepSeek-V3 has 61 layers (a prime): the enumeration's even layout (``L mod (p v) == 0``, the
laws ``check`` applies without a pipeline layout string) leaves p = 1 on 256 GPUs; space 3 adds
the balanced layouts (stop 37, same machine: about 1.5 s; its best, ``tp=2 pp=2 v=8`` with
``Et*3|(t*4|)*14ttmL``, 9.51 s against the even space's 9.55 s). Without the micro-batch cap
its lawful candidates (126,225) pass ``MAX_SEARCH_CANDIDATES``.
"""

from __future__ import annotations

import time

from blueprinting.hardware.presets import system_preset
from blueprinting.mapping.presets import model_preset
from blueprinting.mapping.transformer import AllToAllDispatcher, FlexDispatcher
from blueprinting.search.rank import run_search
from blueprinting.search.space import PipelineLayouts, SearchSpace


def main() -> None:
    model = model_preset("deepseek-v3")
    system = system_preset("dgx-gb200")
    base = {"gpu_counts": (256,), "global_batch_size": 2048, "gpus_per_node": system.gpus_per_node}
    spaces = {
        "default (ep auto, etp 1, alltoall)": SearchSpace(**base),  # type: ignore[arg-type]
        "wider (etp 1|2, alltoall|flex-deepep, +overlap)": SearchSpace(
            **base,  # type: ignore[arg-type]
            expert_tensor_parallel=(1, 2),
            dispatchers=(
                AllToAllDispatcher(),
                AllToAllDispatcher(overlap=True),
                FlexDispatcher(),
                FlexDispatcher(overlap=True),
            ),
        ),
        "balanced layouts (mbs <= 2)": SearchSpace(
            **base,  # type: ignore[arg-type]
            max_microbatch_size=2,
            pipeline_layouts=PipelineLayouts.BALANCED,
        ),
    }
    for name, space in spaces.items():
        start = time.perf_counter()
        result = run_search(model, system, space)
        seconds = time.perf_counter() - start
        print(
            f"deepseek-v3 / dgx-gb200 / 256 GPUs / B=2048, {name}: "
            f"enumerated {result.candidates_enumerated:,} / lawful {result.candidates_valid:,} "
            f"/ fit {result.candidates_fit:,} / {seconds:.2f} s"
        )


if __name__ == "__main__":
    main()
