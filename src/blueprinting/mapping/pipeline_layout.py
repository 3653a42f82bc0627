"""Megatron-LM's ``pipeline_model_parallel_layout`` string <-> :class:`FlexibleStages`.

The string is read only here, at the boundary; the core sees the typed layout. The grammar is
Megatron-LM's (``megatron/core/transformer/pipeline_parallel_layer_layout.py``
``parse_str_to_list`` @d98e8a64): commas are cosmetic and dropped; ``(X)*n`` repeats ``X``
n times, then ``x*n`` repeats the single character before it; ``|`` splits virtual stages,
listed in Megatron's flattened order (chunk c of rank r is stage c * p + r); ``E`` is the
embedding, ``t`` a decoder block, ``m`` an MTP layer, ``L`` the loss (output layer, final norm
and loss). Example: ``Et|(tt|)*30L`` is 32 stages, 61 blocks.

What the typed layout cannot hold is refused here with the character's position (0-based, in
the string as given): unknown characters, unbalanced or nested parentheses, a ``*`` without a
count, an embedding that is not the first layer of its stage, a loss that is not the last, a
second ``E`` or ``L`` in a stage, an ``m`` before a ``t`` of its stage. The rules on the typed
value (stage count p * v, blocks = num_layers, embedding in the first stage, loss in the last,
the MTP depths = ``mtp_num_layers`` in the loss's stage) are laws
(:func:`blueprinting.mapping.laws.flexible_layout_laws`).
"""

from __future__ import annotations

from enum import StrEnum

from blueprinting.errors import ConfigError
from blueprinting.limits import decimal_value
from blueprinting.mapping.transformer import FlexibleStages, LayoutStage

_LAYERS = {"E": "embedding", "t": "decoder block", "m": "MTP layer", "L": "loss"}
_Token = tuple[str, int]  # (character, position in the original string)

MAX_LAYOUT_STAGES = 1 << 16
"""Stages a layout may expand to (a repetition count is a user-given integer)."""


def _count(tokens: list[_Token], at: int) -> tuple[int, int] | None:
    """The decimal count starting at ``tokens[at]`` and the index after it, or None."""
    end = at
    while end < len(tokens) and tokens[end][0] in "0123456789":
        end += 1
    if end == at:
        return None
    count = decimal_value("".join(ch for ch, _ in tokens[at:end]))
    assert count is not None  # ASCII digits by the loop above
    return count, end


def _unroll_groups(tokens: list[_Token], problems: list[str]) -> list[_Token]:
    out: list[_Token] = []
    i = 0
    while i < len(tokens):
        ch, pos = tokens[i]
        if ch == ")":
            problems.append(f"')' at position {pos} closes no '('")
            i += 1
            continue
        if ch != "(":
            out.append(tokens[i])
            i += 1
            continue
        close = i + 1
        while close < len(tokens) and tokens[close][0] not in "()":
            close += 1
        if close == len(tokens):
            problems.append(f"'(' at position {pos} is never closed")
            return out
        if tokens[close][0] == "(":
            problems.append(
                f"'(' at position {tokens[close][1]} is nested in the group opened at position "
                f"{pos}: Megatron-LM's layout parser does not nest groups"
            )
            return out
        if close == i + 1:
            problems.append(f"the group at position {pos} is empty")
        star = close + 1
        counted = (
            _count(tokens, star + 1) if star < len(tokens) and tokens[star][0] == "*" else None
        )
        if counted is None:
            problems.append(f"the group at position {pos} needs a repetition count: (...)*n")
            return out
        n, after = counted
        if n * (close - i) > MAX_LAYOUT_STAGES * 8:
            problems.append(f"the group at position {pos} repeats {n} times: too large")
            return out
        out.extend(tokens[i + 1 : close] * n)
        i = after
    return out


def _unroll_characters(tokens: list[_Token], problems: list[str]) -> list[_Token]:
    out: list[_Token] = []
    i = 0
    while i < len(tokens):
        ch, pos = tokens[i]
        if i + 1 < len(tokens) and tokens[i + 1][0] == "*" and ch != "*":
            counted = _count(tokens, i + 2)
            if counted is None:
                problems.append(f"'*' at position {tokens[i + 1][1]} needs a repetition count")
                return out
            n, after = counted
            if n > MAX_LAYOUT_STAGES * 8:
                problems.append(f"'{ch}*{n}' at position {pos}: too large")
                return out
            out.extend([tokens[i]] * n)
            i = after
            continue
        out.append(tokens[i])
        i += 1
    return out


def _stage(tokens: list[_Token], start: int, problems: list[str]) -> LayoutStage:
    embedding = loss = False
    blocks = 0
    mtp: list[int] = []
    for k, (ch, pos) in enumerate(tokens):
        match ch:
            case "E":
                if embedding:
                    problems.append(f"a second 'E' at position {pos} in one stage")
                elif k != 0:
                    problems.append(
                        f"'E' at position {pos} must be the first layer of its stage (Megatron-LM: "
                        "the first layer must be embedding)"
                    )
                embedding = True
            case "L":
                if loss:
                    problems.append(f"a second 'L' at position {pos} in one stage")
                elif k != len(tokens) - 1:
                    problems.append(
                        f"'L' at position {pos} must be the last layer of its stage (Megatron-LM: "
                        "the last layer must be loss)"
                    )
                loss = True
            case "t":
                if mtp:
                    problems.append(
                        f"'t' at position {pos} after an 'm' of its stage (Megatron-LM builds "
                        "the MTP depths after the decoder blocks)"
                    )
                blocks += 1
            case "m":
                mtp.append(pos)
            case _:
                hint = next((c for c in _LAYERS if c.lower() == ch.lower()), None)
                mean = f"; did you mean {hint!r}?" if hint else ""
                known = ", ".join(f"{c} ({name})" for c, name in _LAYERS.items())
                problems.append(
                    f"invalid layer character {ch!r} at position {pos} (known: {known}){mean}"
                )
    return LayoutStage(
        embedding=embedding,
        decoder_layers=blocks,
        loss=loss,
        mtp_layers=len(mtp),
        position=start,
    )


def parse_pipeline_layout(text: str) -> FlexibleStages:
    """The typed layout of a Megatron-LM layout string; every problem at once, each with its
    position, as a :class:`ConfigError`."""
    source = "pipeline_model_parallel_layout"
    if not text.strip():
        raise ConfigError(["the layout string is empty"], source=source)
    problems: list[str] = []
    tokens = [(ch, pos) for pos, ch in enumerate(text) if ch not in ", \t"]
    tokens = _unroll_characters(_unroll_groups(tokens, problems), problems)
    if problems:
        raise ConfigError(problems, source=source)
    stages: list[LayoutStage] = []
    current: list[_Token] = []
    start = 0
    for ch, pos in [*tokens, ("|", len(text))]:
        if ch != "|":
            current.append((ch, pos))
            continue
        stages.append(_stage(current, start if not current else current[0][1], problems))
        if len(stages) > MAX_LAYOUT_STAGES:
            problems.append(f"the layout expands to more than {MAX_LAYOUT_STAGES} stages")
            break
        current, start = [], pos + 1
    if problems:
        raise ConfigError(problems, source=source)
    return FlexibleStages(stages=tuple(stages))


def _stage_text(stage: LayoutStage) -> str:
    n = stage.decoder_layers
    blocks = "t" * n if n <= 2 else f"t*{n}"
    mtp = "m" * stage.mtp_layers
    return ("E" if stage.embedding else "") + blocks + mtp + ("L" if stage.loss else "")


def format_pipeline_layout(layout: FlexibleStages) -> str:
    """The layout as a Megatron-LM string; runs of equal stages before the last one are written
    ``(X|)*n``. ``parse_pipeline_layout`` reads it back to an equal value."""
    texts = [_stage_text(stage) for stage in layout.stages]
    parts: list[str] = []
    i = 0
    while i < len(texts) - 1:
        run = i
        while run + 1 < len(texts) - 1 and texts[run + 1] == texts[i]:
            run += 1
        n = run - i + 1
        parts.append(f"({texts[i]}|)*{n}" if n > 2 else "".join(f"{texts[i]}|" for _ in range(n)))
        i = run + 1
    parts.append(texts[-1])
    return "".join(parts)


class PipelineLayouts(StrEnum):
    """Which stage layouts a search enumerates (``--pipeline-layouts``).

    ``even``: Megatron's default split only, ``L mod (p v) == 0`` (every chunk holds L / (p v)
    blocks). ``balanced``: also, for every (p, v) the layer count does not split over and v up
    to ``BALANCED_LAYOUT_MAX_VIRTUAL``, the layout :func:`~blueprinting.mapping.pipeline_layout.
    balanced_layout` builds (Megatron's ``--pipeline-model-parallel-layout``): the embedding, the
    blocks, the MTP depths and the loss as evenly as they go over the p v virtual stages, as
    NVIDIA lays out Llama 3.1 405B at PP 16 and DeepSeek-V3 at PP 4 / PP 8."""

    EVEN = "even"
    BALANCED = "balanced"


#: The most virtual stages per rank a balanced layout is generated for (the search's
#: ``--pipeline-layouts balanced``): Megatron-Bridge's published layouts use up to 8
#: (Llama 3.1 405B at PP 16, ``E|(t|)*126L``; DeepSeek-V3 at PP 8 x VP 4 and PP 4 x VP 4).
BALANCED_LAYOUT_MAX_VIRTUAL = 8


def balanced_layout(num_layers: int, mtp_layers: int, stages: int) -> FlexibleStages | None:
    """The layout that spreads the model's layers as evenly as possible over ``stages`` virtual
    stages, the embedding, each MTP depth and the loss counted as one layer each (the weighting
    of Megatron-LM's ``account_for_embedding_in_pipeline_split`` /
    ``account_for_loss_in_pipeline_split``, which require an exact split; this one allows a
    remainder): of the ``u = num_layers + 2 + mtp_layers`` units, the first ``u mod stages``
    stages take one more than the others, the embedding opens the first stage, and the MTP
    depths and the loss close the last one. None when the last stage cannot hold the MTP
    depths and the loss (fewer than ``1 + mtp_layers`` units per stage).

    It reproduces the layouts NVIDIA runs where the layer count does not split:
    ``E|(t|)*126L`` for Llama 3.1 405B over 128 stages (Megatron-Bridge's 405B PP 16 x VP 8
    recipes), ``Et|(tt|)*30L`` for DeepSeek-V3 without MTP over 32 stages and ``Et|(tt|)*30mL``
    with one MTP depth (NVIDIA's DeepSeek-V3 GB200 reproduce guide, NVIDIA/Megatron-LM
    @1d9edcf8c7c1; Megatron-Bridge's 25.09 H100 recipe)."""
    if stages < 1 or num_layers < 0 or mtp_layers < 0:
        return None
    units = num_layers + 2 + mtp_layers
    per_stage, extra = divmod(units, stages)
    if per_stage < 1 + mtp_layers:
        return None
    out: list[LayoutStage] = []
    for k in range(stages):
        first, last = k == 0, k == stages - 1
        size = per_stage + (1 if k < extra else 0)
        out.append(
            LayoutStage(
                embedding=first,
                # every stage holds at least its units' worth of E, m and L (per_stage >= 1 + m)
                decoder_layers=size - (1 if first else 0) - ((1 + mtp_layers) if last else 0),
                loss=last,
                mtp_layers=mtp_layers if last else 0,
            )
        )
    return FlexibleStages(stages=tuple(out))
