"""Transformer Engine's userbuffer overlap of one TP collective with one GEMM: the formulas.

Megatron-LM ``--tp-comm-overlap`` (``megatron/core/model_parallel_config.py`` l.265-340
@d98e8a64) hands the sequence-parallel collectives of qkv, proj, fc1 and fc2 to Transformer
Engine's userbuffers (``transformer_engine/pytorch/module/base.py`` l.336-396 @d0067d0d). Three
methods, each timed here on the critical path of one GPU; ``chunk_s`` is one GEMM chunk's time at
its own (smaller) shape, ``link_s`` the whole collective's link time, ``sm_fraction`` the share
of the SMs the communication kernel holds while the GEMM runs (``num_sm / sm_count``):

- ring exchange (``comm_gemm_overlap.cpp`` l.1044-1200): the GEMM runs as t chunks, the t - 1
  P2P steps (each ``link_s / (t - 1)``) run beside the first t - 1 chunks, the last chunk runs
  bare. TE's default takes 1 SM and no SM margin (the GEMM keeps every SM), so the share is
  ``1 / sm_count`` while a step runs:
  ``time = (t - 1) * max(chunk / (1 - u), step) + chunk``.
- pipeline (l.611-760): the GEMM runs as ``splits`` chunks on ``sm_count - 16`` SMs (TE's
  ``set_sm_margin``), chunk i's reduce-scatter runs beside chunk i + 1 and the last one is exposed:
  ``time = splits * chunk / (1 - u) + (splits - 1) * max(0, step - chunk / (1 - u)) + step`` with
  ``step = link_s / splits``. This is Calculon's 'pipe' (``calculon/llm/layers.py``
  ``LinearOverlapped.compute_processing_time``, caa4b11) with ``splits`` tiles and the exposed
  tile counted once (Calculon counts it in both the compute and the exposed time).
- bulk (l.444-500): the whole collective on 16 SMs beside a whole, unrelated GEMM on
  ``sm_count - 16`` SMs: ``time = max(gemm / (1 - u), link)``.

Each result splits the time into the GEMM's part (``compute_s``, its chunking and SM-share cost
included) and the link time left on the critical path (``exposed_s``). Both the scalar plan and
the search (which calls the scalar block costing once per key) take these functions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import final

#: SMs a ring-exchange communication kernel takes (TE ``module/base.py`` defaults, d0067d0d).
RING_EXCHANGE_SMS = 1
#: SMs a pipelined or bulk communication kernel takes, kept off the GEMM (``set_sm_margin``).
PIPELINE_SMS = 16


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class OverlappedTime:
    """One collective overlapped with one GEMM: the GEMM's time on the critical path (chunked and
    slowed) and the link time that stays exposed."""

    compute_s: float
    exposed_s: float


def sm_fraction(sms: int, sm_count: int | None) -> float:
    """The share ``sms / sm_count`` of the accelerator a communication kernel holds (0 when the
    SM count is unknown)."""
    return 0.0 if sm_count is None else sms / sm_count


def ring_exchange(
    *, chunk_s: float, link_s: float, chunks: int, sm_fraction: float
) -> OverlappedTime:
    """Ring-exchange all-gather in ``chunks`` = t steps (module docstring)."""
    steps = chunks - 1
    if steps < 1:
        return OverlappedTime(compute_s=chunk_s, exposed_s=link_s)
    slowed = chunk_s / (1.0 - sm_fraction)
    step = link_s / steps
    return OverlappedTime(
        compute_s=steps * slowed + chunk_s, exposed_s=steps * max(0.0, step - slowed)
    )


def pipelined_reduce_scatter(
    *, chunk_s: float, link_s: float, splits: int, sm_fraction: float
) -> OverlappedTime:
    """Pipelined reduce-scatter in ``splits`` chunks, the last one exposed (module docstring)."""
    slowed = chunk_s / (1.0 - sm_fraction)
    step = link_s / splits
    return OverlappedTime(
        compute_s=splits * slowed,
        exposed_s=step + (splits - 1) * max(0.0, step - slowed),
    )


def bulk(*, gemm_s: float, link_s: float, sm_fraction: float) -> OverlappedTime:
    """A whole collective beside a whole GEMM that runs on the remaining SMs (module docstring)."""
    slowed = gemm_s / (1.0 - sm_fraction)
    return OverlappedTime(compute_s=slowed, exposed_s=max(0.0, link_s - slowed))
