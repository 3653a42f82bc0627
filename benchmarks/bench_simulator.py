"""Time and memory to build and simulate p=64, v=4, m=1024 interleaved 1F1B
(about half a million compute commands plus their P2P transfers).

Run: .venv/bin/python benchmarks/bench_simulator.py
"""

from __future__ import annotations

import resource
import time

from blueprinting.mapping.transformer import InterleavedOneForwardOneBackward
from blueprinting.simulator import ScheduleCosts, build_schedule, simulate


def main() -> None:
    p, v, m = 64, 4, 1024
    costs = ScheduleCosts.uniform(
        pipeline_degree=p,
        microbatch_count=m,
        virtual_stages=v,
        forward_s=1e-3,
        backward_s=2e-3,
        p2p_latency_s=1e-5,
    )
    schedule = InterleavedOneForwardOneBackward(virtual_stages=v)
    t0 = time.perf_counter()
    dag = build_schedule(schedule, costs)
    t1 = time.perf_counter()
    result = simulate(dag)
    t2 = time.perf_counter()
    compute = sum(len(dag.programs[2 * r]) for r in range(p))
    peak_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"p={p} v={v} m={m}: {len(dag)} commands ({compute} compute)")
    print(f"build    {t1 - t0:.3f} s")
    print(f"simulate {t2 - t1:.3f} s")
    print(f"total    {t2 - t0:.3f} s")
    print(f"peak RSS {peak_rss_mib:.0f} MiB")
    print(f"makespan {result.makespan_s:.6f} s, bubble {result.bubble_s:.6f} s")


if __name__ == "__main__":
    main()
