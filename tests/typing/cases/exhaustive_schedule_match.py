"""Must PASS mypy: the positive control, every PipelineSchedule variant is handled."""

from typing import assert_never

from blueprinting.mapping.transformer import (
    CombinedOneForwardOneBackward,
    DualPipe,
    DualPipeV,
    ForwardOnly,
    InterleavedOneForwardOneBackward,
    OneForwardOneBackward,
    PipelineSchedule,
    SingleStage,
    ZeroBubbleH1,
)


def describe(schedule: PipelineSchedule) -> str:
    match schedule:
        case SingleStage():
            return "single"
        case OneForwardOneBackward():
            return "1f1b"
        case InterleavedOneForwardOneBackward(virtual_stages=v):
            return f"interleaved x{v}"
        case CombinedOneForwardOneBackward(virtual_stages=v):
            return f"combined x{v}"
        case ZeroBubbleH1():
            return "zb-h1"
        case DualPipe():
            return "dualpipe"
        case DualPipeV():
            return "dualpipev"
        case ForwardOnly():
            return "forward"
        case _ as unreachable:
            assert_never(unreachable)
