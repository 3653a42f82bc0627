"""How many transformer blocks each pipeline stage and each virtual chunk holds.

Even split: every stage holds L / p blocks, every chunk L / (p * v) (Narayanan et al. 2021,
Section 2.2.2). Flexible layout (Megatron-LM's ``pipeline_model_parallel_layout``): the counts
of every virtual chunk as given. Uneven split: Megatron-LM's ``decoder_first_pipeline_num_layers`` /
``decoder_last_pipeline_num_layers`` fix the first / last stage, and the remaining blocks are split
evenly over the other stages (``megatron/core/transformer/transformer_block.py``,
``get_num_layers_to_build``).

The laws (``mapping/laws.py``) require every division to be exact. These functions never refuse a
non-exact split: they hand the remainder to the earliest stages / chunks, so that an analysis of a
strategy the laws would refuse still sums to L blocks. Callers check laws first.
"""

from __future__ import annotations

from functools import lru_cache
from typing import assert_never

from blueprinting.errors import InvalidStrategyError, LawViolation
from blueprinting.mapping.model import TransformerModelSpec
from blueprinting.mapping.transformer import (
    DualPipeV,
    EvenStages,
    FlexibleStages,
    PipelineParallel,
    RecomputeMethod,
    UnevenStages,
    virtual_stages_of,
)


def _spread(total: int, parts: int) -> tuple[int, ...]:
    base, extra = divmod(total, parts)
    return tuple(base + (1 if i < extra else 0) for i in range(parts))


@lru_cache(maxsize=1024)
def stage_layer_counts(model: TransformerModelSpec, pipeline: PipelineParallel) -> tuple[int, ...]:
    """Blocks on each physical pipeline stage, stage 0 first; sums to ``model.num_layers``."""
    p = pipeline.degree
    layers = model.num_layers
    if p == 1:
        return (layers,)
    match pipeline.layout:
        case EvenStages():
            return _spread(layers, p)
        case UnevenStages(first_stage_layers=first, last_stage_layers=last):
            fixed = {0: first, p - 1: last}
            given = {stage: count for stage, count in fixed.items() if count is not None}
            rest = layers - sum(given.values())
            free = [stage for stage in range(p) if stage not in given]
            if rest < 0 or (not free and rest != 0):
                raise InvalidStrategyError(
                    [
                        LawViolation(
                            law="uneven_stage_layers",
                            formula="first + last <= num_layers (== when p = 2)",
                            values=(
                                ("first_stage_layers", first),
                                ("last_stage_layers", last),
                                ("num_layers", layers),
                                ("pipeline_degree", p),
                            ),
                            message=(
                                "checking the uneven stage layout: the fixed first/last stage "
                                f"block counts ({first}, {last}) do not fit {layers} blocks "
                                f"on {p} stages"
                            ),
                        )
                    ],
                    subject="stage layout",
                )
            spread = _spread(rest, len(free)) if free else ()
            counts = dict(given)
            counts.update(zip(free, spread, strict=True))
            return tuple(counts[stage] for stage in range(p))
        case FlexibleStages():
            return tuple(sum(chunks) for chunks in chunk_layer_counts(model, pipeline))
        case _ as unreachable:
            assert_never(unreachable)


@lru_cache(maxsize=1024)
def chunk_layer_counts(
    model: TransformerModelSpec, pipeline: PipelineParallel
) -> tuple[tuple[int, ...], ...]:
    """Blocks of each virtual chunk on each physical stage: ``result[stage][chunk]``. A flexible
    layout gives them directly (virtual stage c * p + r); a layout with fewer stages than p * v
    (which the laws refuse) leaves the missing chunks empty."""
    v = virtual_stages_of(pipeline.schedule)
    p = pipeline.degree
    if isinstance(pipeline.layout, FlexibleStages):
        stages = pipeline.layout.stages
        return tuple(
            tuple(
                stages[c * p + r].decoder_layers if c * p + r < len(stages) else 0 for c in range(v)
            )
            for r in range(p)
        )
    return tuple(_spread(count, v) for count in stage_layer_counts(model, pipeline))


def fully_recomputed_blocks(method: RecomputeMethod, num_layers: int, blocks_in_chunk: int) -> int:
    """Blocks of one model chunk whose forward runs again in backward under full recompute.

    ``uniform`` checkpoints groups of ``num_layers`` blocks and re-runs all of them; ``block``
    re-runs the first ``num_layers`` blocks of each chunk and stores the rest (Megatron-LM
    ``transformer_block.py`` ``_checkpointed_forward``, applied per model chunk)."""
    match method:
        case RecomputeMethod.UNIFORM:
            return blocks_in_chunk
        case RecomputeMethod.BLOCK:
            return min(num_layers, blocks_in_chunk)
        case _ as unreachable:
            assert_never(unreachable)


def model_chunk_order(pipeline: PipelineParallel) -> tuple[tuple[int, int], ...]:
    """(stage, chunk) of each model chunk in layer order: virtual stage ``c * p + r`` is chunk
    c of rank r (Megatron's interleaving), except DualPipeV's V: chunk 0 runs down the ranks,
    chunk 1 back up (deepseek-ai/DualPipe ``dualpipev.py``), which is why its loss is on rank
    0."""
    p, v = pipeline.degree, virtual_stages_of(pipeline.schedule)
    if isinstance(pipeline.schedule, DualPipeV):
        return (*((r, 0) for r in range(p)), *((r, 1) for r in reversed(range(p))))
    return tuple((r, c) for c in range(v) for r in range(p))


@lru_cache(maxsize=1024)
def chunk_layer_starts(
    model: TransformerModelSpec, pipeline: PipelineParallel
) -> tuple[tuple[int, ...], ...]:
    """The index of the first decoder layer of each virtual chunk, ``result[stage][chunk]``
    (layers fill the model chunks in :func:`model_chunk_order`)."""
    counts = chunk_layer_counts(model, pipeline)
    starts = [[0] * len(counts[0]) for _ in counts]
    position = 0
    for stage, chunk in model_chunk_order(pipeline):
        starts[stage][chunk] = position
        position += counts[stage][chunk]
    return tuple(tuple(row) for row in starts)
