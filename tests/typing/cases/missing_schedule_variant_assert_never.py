"""Must FAIL mypy: the match omits ForwardOnly, so the house-style catch-all hands a
ForwardOnly to assert_never (an [arg-type] error naming the missing variant)."""

from typing import assert_never

from blueprinting.mapping.transformer import (
    CombinedOneForwardOneBackward,
    DualPipe,
    DualPipeV,
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
        case _ as unreachable:
            assert_never(unreachable)
