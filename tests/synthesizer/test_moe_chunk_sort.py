"""The alltoall dispatcher's chunk sort (``moe_sort_chunks`` / ``moe_unsort_chunks``): the
received rows into local-expert order after the dispatch and back before the combine, a
memory pass over them in each direction, only with more than one local expert."""

from __future__ import annotations

from blueprinting.mapping.transformer import FlexDispatcher
from blueprinting.synthesizer.dialects.transformer.training import (
    CollectivePurpose,
    SemanticOpName,
)
from blueprinting.synthesizer.dialects.transformer.training_derivation import (
    derive_training_block,
)
from blueprinting.synthesizer.stages.distributed.ir import CollectiveTask, ComputeTask, Phase
from tests.synthesizer.moe_models import mixtral_like
from tests.synthesizer.test_moe_block import _mapping

_SORTS = (SemanticOpName.MOE_SORT_CHUNKS, SemanticOpName.MOE_UNSORT_CHUNKS)


def test_the_sort_moves_every_received_row_once_each_way() -> None:
    """Mixtral (E = 8, k = 2, h = 4096, BF16) at ep 2: T = 4096 tokens, R = 8192 routed rows,
    balanced: the rank receives 8192 rows for its 4 local experts; each sort reads and writes
    8192 x 4096 x 2 B = 67,108,864 B in the forward and the data gradient, nothing in the
    weight gradient."""
    ir = derive_training_block(mixtral_like(), _mapping(ep=2, dp=2))
    assert ir.moe_block is not None
    moved = 8192 * 4096 * 2
    sorts = [t for t in ir.moe_block.tasks if isinstance(t, ComputeTask) and t.lineage.op in _SORTS]
    assert {(t.lineage.op, t.phase) for t in sorts} == {
        (op, phase) for op in _SORTS for phase in (Phase.FORWARD, Phase.BACKWARD_ACTIVATION_GRAD)
    }
    assert all(t.work.bytes_read == t.work.bytes_written == moved for t in sorts)
    assert all(t.work.flops == 0 for t in sorts)


def test_the_exchanges_sit_outside_the_sort() -> None:
    """The dispatch and the routing probabilities arrive before the sort, the combine leaves
    after the unsort (``dispatch_postprocess`` / ``combine_preprocess``)."""
    ir = derive_training_block(mixtral_like(), _mapping(ep=2, dp=2))
    assert ir.moe_block is not None
    tasks = list(ir.moe_block.tasks)
    forward = [t for t in tasks if t.phase is Phase.FORWARD]
    names = [
        t.lineage.op if isinstance(t, ComputeTask) else t.purpose.value + ":" + t.lineage.op.value
        for t in forward
        if isinstance(t, ComputeTask) or t.purpose is CollectivePurpose.TOKEN_DISPATCH
    ]
    sort = names.index(SemanticOpName.MOE_SORT_CHUNKS)
    unsort = names.index(SemanticOpName.MOE_UNSORT_CHUNKS)
    dispatches = [i for i, n in enumerate(names) if n.startswith("token_dispatch")]
    assert dispatches and all(i < sort or i > unsort for i in dispatches)
    assert names[unsort + 1].startswith("token_dispatch")  # the combine


def test_no_sort_with_one_local_expert_or_a_flex_dispatcher() -> None:
    for mapping in (_mapping(ep=8, dp=8), _mapping(ep=2, dp=2, dispatcher=FlexDispatcher())):
        ir = derive_training_block(mixtral_like(), mapping)
        assert ir.moe_block is not None
        assert not any(
            isinstance(t, ComputeTask) and t.lineage.op in _SORTS for t in ir.moe_block.tasks
        )
        dispatch = [
            t
            for t in ir.moe_block.tasks
            if isinstance(t, CollectiveTask) and t.purpose is CollectivePurpose.TOKEN_DISPATCH
        ]
        assert {t.lineage.op for t in dispatch} <= {
            SemanticOpName.EXPERT_FC1,
            SemanticOpName.EXPERT_FC2,
        }
