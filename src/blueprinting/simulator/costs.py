"""The simulator's input: per-chunk compute times and communication costs of one pipeline.

A :class:`ScheduleCosts` is what a cost model (PortablePlanIR) hands the simulator; it knows
nothing about layers or FLOPs. Indexing is ``[stage][chunk]``: physical pipeline rank ``r`` and
model chunk ``c`` form virtual stage ``c * p + r`` (Megatron-LM's interleaved layout, Narayanan et
al. 2021, Section 2.2.2). First/last-stage extras (embedding, LM head, loss) and uneven stage
layer counts are expressed by giving those entries larger times.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import final

from blueprinting.errors import ProblemCollector

Matrix = tuple[tuple[float, ...], ...]


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class DpBucket:
    """One data-parallel gradient-reduction bucket of a stage: ready once the last backward
    (weight-gradient) pass of ``chunk`` on that stage has run; takes ``duration_s`` on the
    stage's communication stream."""

    chunk: int
    duration_s: float


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleCosts:
    """Durations (seconds) of every command of one training (or inference) iteration.

    ``backward_s`` is the whole backward of a chunk, recompute included. ``weight_grad_s`` is the
    part of it that computes weight gradients; only split-backward schedules (ZB-H1) run it as a
    separate command, so the input-gradient pass takes ``backward_s - weight_grad_s``.
    A P2P message takes ``p2p_latency_s + p2p_bytes / p2p_bandwidth_bytes_per_s``.
    ``dp_buckets[stage]`` are that stage's gradient-reduction buckets; with
    ``overlap_grad_reduce`` each starts as soon as its chunk's gradients are final, otherwise all
    start after the stage's last compute command (Megatron's ``overlap_grad_reduce``).
    ``activation_bytes[stage][chunk]`` is what one in-flight microbatch of that chunk keeps.

    ``unpaired_forward_s`` / ``unpaired_backward_s`` (combined 1F1B only): ``forward_s`` and
    ``backward_s`` are then the passes' times inside a co-scheduled forward-backward step, and
    these what a pass adds when it runs alone (a warm-up forward, a cool-down backward): the
    expert-parallel all-to-all time its partner's compute would have hidden.
    """

    pipeline_degree: int
    microbatch_count: int
    forward_s: Matrix
    backward_s: Matrix
    weight_grad_s: Matrix | None = None
    p2p_latency_s: float = 0.0
    p2p_bytes: float = 0.0
    p2p_bandwidth_bytes_per_s: float = math.inf
    dp_buckets: tuple[tuple[DpBucket, ...], ...] = ()
    overlap_grad_reduce: bool = False
    activation_bytes: Matrix | None = None
    unpaired_forward_s: Matrix | None = None
    unpaired_backward_s: Matrix | None = None

    def __post_init__(self) -> None:
        problems = ProblemCollector(source="ScheduleCosts")
        p, m = self.pipeline_degree, self.microbatch_count
        if type(p) is not int or p < 1:
            problems.add(f"pipeline_degree must be a positive integer, got {p!r}")
        if type(m) is not int or m < 1:
            problems.add(f"microbatch_count must be a positive integer, got {m!r}")
        problems.raise_if_any()
        v = len(self.forward_s[0]) if self.forward_s else 0
        if v < 1:
            problems.add("forward_s must hold at least one chunk per stage")
        matrices: list[tuple[str, Matrix | None]] = [
            ("forward_s", self.forward_s),
            ("backward_s", self.backward_s),
            ("weight_grad_s", self.weight_grad_s),
            ("activation_bytes", self.activation_bytes),
            ("unpaired_forward_s", self.unpaired_forward_s),
            ("unpaired_backward_s", self.unpaired_backward_s),
        ]
        for name, matrix in matrices:
            if matrix is None:
                continue
            if len(matrix) != p or any(len(row) != v for row in matrix):
                problems.add(f"{name} must be a {p} x {v} matrix [stage][chunk]")
                continue
            if any(not (x >= 0.0 and math.isfinite(x)) for row in matrix for x in row):
                problems.add(f"{name} entries must be finite and non-negative")
        if self.weight_grad_s is not None and len(self.weight_grad_s) == p:
            for r in range(p):
                for c in range(min(v, len(self.weight_grad_s[r]), len(self.backward_s[r]))):
                    if self.weight_grad_s[r][c] > self.backward_s[r][c]:
                        problems.add(
                            f"weight_grad_s[{r}][{c}] = {self.weight_grad_s[r][c]} exceeds "
                            f"backward_s[{r}][{c}] = {self.backward_s[r][c]}"
                        )
        for name, value in (
            ("p2p_latency_s", self.p2p_latency_s),
            ("p2p_bytes", self.p2p_bytes),
        ):
            if not (value >= 0.0 and math.isfinite(value)):
                problems.add(f"{name} must be finite and non-negative, got {value!r}")
        if not self.p2p_bandwidth_bytes_per_s > 0.0:
            bandwidth = self.p2p_bandwidth_bytes_per_s
            problems.add(f"p2p_bandwidth_bytes_per_s must be positive, got {bandwidth!r}")
        if self.dp_buckets and len(self.dp_buckets) != p:
            problems.add(f"dp_buckets must list {p} stages (or be empty)")
        for r, buckets in enumerate(self.dp_buckets):
            for bucket in buckets:
                if not 0 <= bucket.chunk < max(v, 1):
                    problems.add(f"dp_buckets[{r}] names chunk {bucket.chunk}, outside 0..{v - 1}")
                if not (bucket.duration_s >= 0.0 and math.isfinite(bucket.duration_s)):
                    problems.add(f"dp_buckets[{r}] duration must be finite and non-negative")
        problems.raise_if_any()

    @property
    def virtual_stages(self) -> int:
        """v: chunks per stage, the width of the cost matrices."""
        return len(self.forward_s[0])

    @property
    def p2p_time_s(self) -> float:
        """One P2P message: latency + bytes / bandwidth (the alpha-beta model)."""
        return self.p2p_latency_s + self.p2p_bytes / self.p2p_bandwidth_bytes_per_s

    @classmethod
    def uniform(
        cls,
        *,
        pipeline_degree: int,
        microbatch_count: int,
        virtual_stages: int = 1,
        forward_s: float,
        backward_s: float,
        weight_grad_s: float = 0.0,
        p2p_latency_s: float = 0.0,
    ) -> ScheduleCosts:
        """Every chunk of every stage costs the same: tf, tb (full backward), tw (its weight-grad
        part); the setting of the analytic bubble formulas."""
        p, v = pipeline_degree, virtual_stages

        def matrix(x: float) -> Matrix:
            return tuple(tuple(x for _ in range(v)) for _ in range(p))

        return cls(
            pipeline_degree=p,
            microbatch_count=microbatch_count,
            forward_s=matrix(forward_s),
            backward_s=matrix(backward_s),
            weight_grad_s=matrix(weight_grad_s),
            p2p_latency_s=p2p_latency_s,
        )
