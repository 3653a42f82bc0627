"""Time the whole search (issue #8) and rank the published strategies within their own searches.

Run: ``OMP_NUM_THREADS=1 taskset -c 0 .venv/bin/python benchmarks/bench_search.py`` (one core).

1. GPT-3 175B on 1024 A100-80GB GPUs, global batch 1536, the full default space: candidates
   enumerated / evaluated, wall time (enumeration + vectorized evaluation + ranking), candidates
   per second. Target: under 10 s on one core.
2. The published strategies, each searched in its own setting (same model, GPUs, global batch),
   contract bubble, iteration-time objective:
   - Narayanan et al. 2021, Table 1, 145.6B row (``shared/reference/published_runs.json``
     ``narayanan2021_t1_145.6B``): 1536 A100-80GB, t=8 p=8 d=24 v=2 b=2 B=2304, full uniform
     recomputation, no sequence parallelism, no distributed optimizer;
   - Korthikanti et al. 2022, Table 5, 175B (``korthikanti2022_t5_175B_seqsel``): 64 A100-80GB,
     t=8 p=8 d=1 v=3 b=1 B=64, sequence parallelism + selective recomputation.
   It prints the best strategy's iteration time, the published one's rank, and whether the best
   is at least as fast (by the model) as the published one.
3. Llama 3 70B on 1024 H100 at seq_length 32768, global batch 512, micro batch 1, with context
   parallelism in the space (every cp the laws allow, cp_comm_type p2p / all_gather / a2a):
   enumerated, lawful, fit, wall time. Target: under 5 s on one core.
"""

from __future__ import annotations

import dataclasses
import time

from blueprinting.hardware.presets import system_preset
from blueprinting.mapping.presets import model_preset
from blueprinting.mapping.transformer import CpCommType, TrainingSpec
from blueprinting.search.rank import Ranked, run_search, standing
from blueprinting.search.space import SearchSpace
from blueprinting.search.strategy_text import parse_strategy_text

PUBLISHED = (
    (
        "Narayanan 2021 Table 1, 145.6B",
        "gpt-145b",
        1536,
        2304,
        "tp=8 pp=8 v=2 mbs=2 recompute=full-uniform recompute_layers=1",
    ),
    (
        "Korthikanti 2022 Table 5, 175B (sp + selective)",
        "gpt3-175b",
        64,
        64,
        "tp=8 pp=8 v=3 mbs=1 sp=on recompute=selective",
    ),
)


def main() -> None:
    system = system_preset("dgx-a100-80gb")
    model = model_preset("gpt3-175b")
    start = time.perf_counter()
    result = run_search(model, system, SearchSpace(gpu_counts=(1024,), global_batch_size=1536))
    wall = time.perf_counter() - start
    print("GPT-3 175B, 1024 x A100-80GB, B = 1536, full default space")
    print(f"  candidates enumerated: {result.candidates_enumerated:,}")
    print(f"  candidates evaluated:  {len(result.table):,} (legal: {result.candidates_valid:,})")
    print(f"  candidates that fit:   {result.candidates_fit:,}")
    print(f"  wall time:             {wall:.3f} s")
    print(f"  candidates per second: {len(result.table) / wall:,.0f} evaluated")
    best = int(result.order[0])
    print(f"  best: {result.figures.iteration_time_s[best]:.3f} s")

    for label, name, gpus, batch, text in PUBLISHED:
        found = run_search(
            model_preset(name), system, SearchSpace(gpu_counts=(gpus,), global_batch_size=batch)
        )
        mapping = parse_strategy_text(text, global_batch_size=batch, num_gpus=gpus)
        where = standing(found, TrainingSpec(model=found.model, mapping=mapping))
        best_s = float(found.figures.iteration_time_s[found.order[0]])
        print(f"{label}: {text}")
        print(f"  best found: {best_s:.3f} s ({found.candidates_fit:,} fit)")
        if isinstance(where, Ranked):
            print(
                f"  published: rank {where.rank} of {where.of}, {where.score:.3f} s "
                f"({100 * where.gap:+.2f}% vs best); best at least as fast: "
                f"{best_s <= where.score}"
            )
        else:
            print(f"  published: {where}")

    llama = dataclasses.replace(model_preset("llama3-70b"), seq_length=32768)
    space = SearchSpace(
        gpu_counts=(1024,),
        global_batch_size=512,
        max_microbatch_size=1,
        context_parallel=None,
        cp_comm_types=(CpCommType.P2P, CpCommType.ALL_GATHER, CpCommType.A2A),
    )
    start = time.perf_counter()
    found = run_search(llama, system_preset("dgx-h100"), space)
    wall = time.perf_counter() - start
    best = int(found.order[0])
    print("Llama 3 70B, 1024 x H100, s = 32768, B = 512, b = 1, cp and cp_comm_type searched")
    print(f"  candidates enumerated: {found.candidates_enumerated:,}")
    print(f"  legal: {found.candidates_valid:,}, fit: {found.candidates_fit:,}")
    print(f"  wall time: {wall:.3f} s")
    print(f"  best: {found.figures.iteration_time_s[best]:.3f} s, cp = {found.table.context[best]}")


if __name__ == "__main__":
    main()
