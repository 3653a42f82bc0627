"""Chrome trace-event JSON of a simulation (opens in Perfetto and chrome://tracing).

Format: the Trace Event Format's "X" (complete) events, one per command, with "M" metadata
events naming one process per pipeline rank and one thread per stream. Times in microseconds.
"""

from __future__ import annotations

import json
from pathlib import Path

from blueprinting.simulator.commands import COMM_STREAM, COMPUTE_STREAM, KIND_BY_CODE
from blueprinting.simulator.engine import SimulationResult

JsonValue = str | int | float | dict[str, "JsonValue"] | list["JsonValue"]


def chrome_trace_events(result: SimulationResult) -> list[dict[str, JsonValue]]:
    dag = result.dag
    events: list[dict[str, JsonValue]] = []
    for r in range(dag.pipeline_degree):
        events.append(
            {"name": "process_name", "ph": "M", "pid": r, "tid": 0, "args": {"name": f"rank {r}"}}
        )
        for tid, label in ((COMPUTE_STREAM, "compute"), (COMM_STREAM, "comm")):
            events.append(
                {"name": "thread_name", "ph": "M", "pid": r, "tid": tid, "args": {"name": label}}
            )
    kinds, chunks, micro = dag.kind.tolist(), dag.chunk.tolist(), dag.microbatch.tolist()
    peers, starts, durations = dag.peer.tolist(), result.start_s.tolist(), dag.duration_s.tolist()
    for s, program in enumerate(dag.programs):
        r, tid = divmod(s, 2)
        for c in program.tolist():
            kind = KIND_BY_CODE[kinds[c]]
            mb = micro[c]
            name = f"{kind}{mb}.{chunks[c]}" if mb >= 0 else f"{kind} chunk {chunks[c]}"
            args: dict[str, JsonValue] = {
                "kind": str(kind),
                "chunk": chunks[c],
                "microbatch": mb,
                "command": c,
            }
            if peers[c] >= 0:
                args["peer"] = peers[c]
            events.append(
                {
                    "name": name,
                    "cat": str(kind),
                    "ph": "X",
                    "pid": r,
                    "tid": tid,
                    "ts": starts[c] * 1e6,
                    "dur": durations[c] * 1e6,
                    "args": args,
                }
            )
    return events


def write_chrome_trace(result: SimulationResult, path: str | Path) -> Path:
    """Write the trace to ``path`` (JSON object format with ``traceEvents``)."""
    out = Path(path)
    document: dict[str, JsonValue] = {
        "traceEvents": list(chrome_trace_events(result)),
        "displayTimeUnit": "ms",
    }
    out.write_text(json.dumps(document))
    return out
