"""Must FAIL mypy with [exhaustive-match]: the match omits ForwardOnly and has no catch-all."""

from blueprinting.mapping.transformer import (
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
        case ZeroBubbleH1():
            return "zb-h1"
    return "unreachable only if the match were exhaustive"
