"""The work a search shares across block configurations (issue 18) changes no figure: the
memoized lowering, verification and costing against the same pipeline with every memo
dropped, and the mixed-radix keys against ``np.unique(axis=0)``."""

from __future__ import annotations

import dataclasses

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blueprinting.analysis import evaluate
from blueprinting.errors import VerificationError
from blueprinting.hardware.presets import system_preset
from blueprinting.hardware.system import SystemSpec
from blueprinting.mapping.precision import Fp8Precision, HighPrecision
from blueprinting.mapping.transformer import (
    AllGatherDispatcher,
    AllToAllDispatcher,
    TrainingSpec,
)
from blueprinting.search import evaluate_vectorized
from blueprinting.search.space import (
    CandidateTable,
    SearchSpace,
    candidate_to_spec,
    enumerate_strategies,
)
from blueprinting.synthesizer.dialects.transformer import training as training_ops
from blueprinting.synthesizer.dialects.transformer.training import block_ops, placements
from blueprinting.synthesizer.dialects.transformer.training_derivation import (
    derive_block_plan,
    derive_training_block,
)
from blueprinting.synthesizer.stages.distributed import passes as distributed
from blueprinting.synthesizer.stages.distributed.ir import (
    CollectiveTask,
    ComputeTask,
    LogicalMesh,
    MeshAxis,
    Phase,
    TaskGroup,
)
from blueprinting.synthesizer.stages.portable_plan import passes as portable
from blueprinting.synthesizer.stages.portable_plan.ir import PortablePlanIR
from blueprinting.synthesizer.stages.portable_plan.precision import OpPrecision
from tests.synthesizer.moe_models import mixtral_like

MODEL = mixtral_like(layers=4, seq=2048)
SPACE = SearchSpace(
    gpu_counts=(16,),
    global_batch_size=32,
    context_parallel=(1, 2),
    tp_comm_overlap=(False, True),
    dispatchers=(AllToAllDispatcher(), AllGatherDispatcher()),
    max_microbatch_size=2,
)


def _drop_every_memo() -> None:
    portable._SYSTEM_MEMOS.clear()
    distributed._VERIFIED.clear()
    distributed._SPANS.clear()
    distributed._dense_groups.cache_clear()
    distributed._moe_group.cache_clear()
    evaluate._local_block.cache_clear()
    evaluate._local_block_costs.cache_clear()
    placements.cache_clear()
    training_ops._attention_half.cache_clear()


def _figures(table: CandidateTable) -> dict[str, npt.NDArray[np.float64]]:
    figures = evaluate_vectorized.evaluate_candidates(table, MODEL, system_preset("dgx-a100-80gb"))
    return {
        f.name: np.asarray(getattr(figures, f.name))
        for f in dataclasses.fields(figures)
        if isinstance(getattr(figures, f.name), np.ndarray)
    }


def test_search_figures_are_the_same_with_cold_and_warm_memos(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every figure array bit for bit: once with every memo dropped before each block
    configuration's costing (a cold pipeline), once warm."""
    table = enumerate_strategies(MODEL, SPACE).table
    # the space spans the axes the memos share work across
    assert len(set(table.expert.tolist())) >= 2
    assert len(set(table.dispatcher.tolist())) == 2
    assert table.tp_comm_overlap.any() and (~table.tp_comm_overlap).any()
    original = evaluate.portable_plan

    def cold(spec: TrainingSpec, system: SystemSpec) -> PortablePlanIR:
        _drop_every_memo()
        return original(spec, system)

    with monkeypatch.context() as patch:
        patch.setattr(evaluate_vectorized, "portable_plan", cold)
        cold_figures = _figures(table)
    _drop_every_memo()
    warm_figures = _figures(table)
    again = _figures(table)
    assert cold_figures.keys() == warm_figures.keys()
    for name, values in cold_figures.items():
        assert np.array_equal(values, warm_figures[name]), name
        assert np.array_equal(values, again[name]), name
    assert float(warm_figures["ep_comm_exposed"].max()) > 0.0


def test_plans_that_differ_in_the_expert_grid_share_their_dense_groups() -> None:
    """The dense block, first- and last-stage groups are one object across ep / dispatcher,
    and equal to the groups lowered without the memo; the MoE block is not shared."""
    table = enumerate_strategies(MODEL, SPACE).table
    rows = np.flatnonzero(
        (table.tensor == 2)
        & (table.context == 1)
        & (table.micro_batch == 1)
        & ~table.tp_comm_overlap
    )
    by_grid: dict[tuple[int, int], int] = {}
    for i in rows.tolist():
        if table.sequence_parallel[i] and table.recompute[i] == table.recompute[rows[0]]:
            by_grid.setdefault((int(table.expert[i]), int(table.dispatcher[i])), i)
    assert len(by_grid) >= 3
    irs = [
        derive_training_block(MODEL, candidate_to_spec(table, i, MODEL).mapping)
        for i in by_grid.values()
    ]
    first = irs[0]
    for ir in irs[1:]:
        assert ir.block is first.block
        assert ir.first_stage is first.first_stage
        assert ir.last_stage is first.last_stage
        assert ir.moe_block is not first.moe_block
    _drop_every_memo()
    fresh = derive_training_block(
        MODEL, candidate_to_spec(table, next(iter(by_grid.values())), MODEL).mapping
    )
    assert fresh.block is not first.block
    assert fresh == first


def test_task_times_are_memoized_per_system_object() -> None:
    """Two systems that differ in one bandwidth keep their own task times (the memo is found
    by the system's identity), each equal to the unmemoized rule, on every task of a block."""
    a100 = system_preset("dgx-a100-80gb")
    hbm = a100.accelerator.hbm
    slower = dataclasses.replace(
        a100,
        accelerator=dataclasses.replace(
            a100.accelerator,
            hbm=dataclasses.replace(hbm, bandwidth_bytes_per_s=hbm.bandwidth_bytes_per_s / 2),
        ),
    )
    table = enumerate_strategies(MODEL, SPACE).table
    ir = derive_training_block(MODEL, candidate_to_spec(table, 0, MODEL).mapping)
    assert ir.moe_block is not None
    precision = OpPrecision(datatype=MODEL.datatype, recipe=HighPrecision())
    tasks = ir.moe_block.compute_tasks()
    assert len(tasks) > 10
    _drop_every_memo()
    for system in (a100, slower, a100, slower):
        for task in tasks:
            plain = portable.work_time(
                task.work,
                task.gemm,
                system,
                MODEL.datatype,
                task.attention,
                gemm_format=precision.gemm_format(
                    task.lineage.op, is_gemm=task.gemm is not None and task.attention is None
                ),
            )
            assert portable._compute_time(task, system, precision) == plain
    total = {
        name: sum(portable._compute_time(task, system, precision) for task in tasks)
        for name, system in (("a100", a100), ("slower", slower))
    }
    assert total["slower"] > total["a100"]
    # The same task objects (each now timed by identity) under another precision object: the
    # identity entry is the precision's it was timed under, never another's.
    h100 = system_preset("dgx-h100")
    for recipe in (Fp8Precision(), HighPrecision(), Fp8Precision(), HighPrecision()):
        other = OpPrecision(datatype=MODEL.datatype, recipe=recipe)
        times = []
        for task in tasks:
            is_gemm = task.gemm is not None and task.attention is None
            plain = portable.work_time(
                task.work,
                task.gemm,
                h100,
                MODEL.datatype,
                task.attention,
                gemm_format=other.gemm_format(task.lineage.op, is_gemm=is_gemm),
            )
            times.append(portable._compute_time(task, h100, other))
            assert times[-1] == plain
        total[str(recipe)] = sum(times)
    assert total[str(Fp8Precision())] < total[str(HighPrecision())]


@settings(max_examples=200, deadline=None)
@given(
    st.integers(min_value=1, max_value=60).flatmap(
        lambda rows: st.lists(
            st.lists(
                st.one_of(st.integers(0, 3), st.integers(-(2**62), 2**62)),
                min_size=rows,
                max_size=rows,
            ),
            min_size=1,
            max_size=12,
        )
    )
)
def test_keys_equal_numpy_unique_rows(columns: list[list[int]]) -> None:
    """The mixed-radix keys: the same representatives and key indices as the row-wise unique
    (columns of huge values force the codes to be re-ranked before they overflow)."""
    arrays = [np.array(c, dtype=np.int64) for c in columns]
    first, inverse = evaluate_vectorized._keys(*arrays)
    stacked = np.stack(arrays, axis=1)
    _, want_first, want_inverse = np.unique(stacked, axis=0, return_index=True, return_inverse=True)
    assert first.tolist() == want_first.tolist()
    assert inverse.tolist() == want_inverse.reshape(-1).tolist()


def test_keys_of_many_wide_columns() -> None:
    """Twelve columns of 5,000 distinct values each: codes past int64 are re-ranked."""
    rng = np.random.default_rng(18)
    arrays = [rng.integers(0, 5000, size=5000, dtype=np.int64) for _ in range(12)]
    first, inverse = evaluate_vectorized._keys(*arrays)
    _, want_first, want_inverse = np.unique(
        np.stack(arrays, axis=1), axis=0, return_index=True, return_inverse=True
    )
    assert first.tolist() == want_first.tolist()
    assert inverse.tolist() == want_inverse.reshape(-1).tolist()


def _rows_differing_in_ep(table: CandidateTable, *, context: int) -> dict[int, int]:
    """ep -> a row, all rows with one attention half (t = 2 with SP, the given cp, b = 1, no
    TP overlap, one recompute policy, the alltoall dispatcher)."""
    rows = np.flatnonzero(
        (table.tensor == 2)
        & table.sequence_parallel
        & (table.context == context)
        & (table.micro_batch == 1)
        & ~table.tp_comm_overlap
        & (table.dispatcher == table.dispatcher[0])
    )
    recompute = table.recompute[rows[0]]
    by_ep: dict[int, int] = {}
    for i in rows.tolist():
        if table.recompute[i] == recompute:
            by_ep.setdefault(int(table.expert[i]), i)
    return by_ep


def test_moe_blocks_lowered_in_spans_equal_the_one_span_lowering(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every MoE block of the space, lowered in spans with the span memo warm (each span
    lowered once for the rows that share it), is task for task (ids, dependencies, order,
    work) the block lowered as one span with every memo dropped; the attention tasks are one
    object across ep, the routed experts' are each ep's own (8 experts: 8 / ep per rank)."""
    table = enumerate_strategies(MODEL, SPACE).table
    _drop_every_memo()
    spanned = [
        derive_training_block(MODEL, candidate_to_spec(table, i, MODEL).mapping)
        for i in range(len(table))
    ]
    with monkeypatch.context() as patch:
        patch.setattr(distributed, "ROUTED_EXPERT_OPS", frozenset())
        for i, ir in enumerate(spanned):
            _drop_every_memo()
            whole = derive_training_block(MODEL, candidate_to_spec(table, i, MODEL).mapping)
            assert whole.moe_block == ir.moe_block, i
    _drop_every_memo()
    by_ep = _rows_differing_in_ep(table, context=2)
    assert sorted(by_ep) == [1, 2, 4, 8]
    blocks = {
        ep: derive_training_block(MODEL, candidate_to_spec(table, i, MODEL).mapping).moe_block
        for ep, i in by_ep.items()
    }
    tasks = {ep: {t.id: t for t in block.tasks} for ep, block in blocks.items() if block}
    # the spans after the routed experts (forward) and before them (backward) go on from the
    # routed experts' last task: one object where that task is the same (the chunk sort's
    # combine / dispatch-gradient all-to-all at ep = 2 and 4), not at ep = 1 (no exchange) nor
    # at ep = 8 (one local expert: no chunk sort, the all-to-alls sit at the expert GEMMs)
    for after in ("fwd.mlp_residual", "agrad.output_projection", "agrad.router"):
        assert tasks[4][after] is tasks[2][after]
        for other in (1, 8):
            assert tasks[other][after] is not tasks[2][after]
            assert tasks[other][after] == dataclasses.replace(
                tasks[2][after], deps=tasks[other][after].deps
            )
    for ep in (2, 4, 8):
        for shared in ("fwd.core_attention", "fwd.router", "fwd.moe_permute"):
            assert tasks[ep][shared] is tasks[1][shared]
        fc1 = tasks[ep]["fwd.expert_fc1"]
        assert isinstance(fc1, ComputeTask) and fc1.gemm is not None
        assert fc1.gemm.batch == 8 // ep
        assert fc1 is not tasks[1]["fwd.expert_fc1"]
    assert "fwd.moe_sort_chunks.ep.all_to_all.dispatch" not in tasks[1]
    assert "fwd.moe_sort_chunks.ep.all_to_all.dispatch" in tasks[2]
    assert "fwd.expert_fc1.ep.all_to_all.dispatch" in tasks[8]


def test_configurations_sharing_the_attention_half_keep_their_own_expert_costs() -> None:
    """Rows that share the attention half (one span, one set of task objects) but differ in
    ep: each MoE block's costs, warm (every other ep costed first), equal the cold pipeline's;
    the ep = 1 block exchanges no tokens, the others' token-dispatch time is the sum of their
    own all-to-all / all-gather times on their own ep communicators."""
    table = enumerate_strategies(MODEL, SPACE).table
    system = system_preset("dgx-a100-80gb")
    by_ep = _rows_differing_in_ep(table, context=1)
    specs = {ep: candidate_to_spec(table, i, MODEL) for ep, i in by_ep.items()}
    cold: dict[int, PortablePlanIR] = {}
    for ep, spec in specs.items():
        _drop_every_memo()
        cold[ep] = evaluate.portable_plan(spec, system)
    _drop_every_memo()
    warm = {ep: evaluate.portable_plan(spec, system) for ep, spec in specs.items()}
    for ep in specs:
        assert warm[ep].moe_block == cold[ep].moe_block, ep
        assert warm[ep].block == cold[ep].block, ep
    forward = {ep: plan.moe_block.forward for ep, plan in warm.items() if plan.moe_block}
    assert forward[1].ep_comm_s == 0.0
    for ep in (2, 4, 8):
        spec = specs[ep]
        ir = derive_training_block(MODEL, spec.mapping)
        assert ir.moe_block is not None
        groups = portable.expert_groups(spec, system)
        want = 0.0
        for task in ir.moe_block.tasks:
            if (
                isinstance(task, CollectiveTask)
                and task.phase is Phase.FORWARD
                and task.axis in groups
            ):
                want += portable._dispatch_time(task, system, groups[task.axis])
        assert want > 0.0
        assert forward[ep].ep_comm_s == want
    assert len({f.ep_comm_s for f in forward.values()}) == 4
    assert len({f.compute_s for f in forward.values()}) == 4


def test_spans_that_would_repeat_a_task_id_are_lowered_as_one() -> None:
    """An op name twice in one group: lowered in spans, the second span would reuse the
    first's ids; the group is lowered as one span, whose builder numbers the repeats."""
    table = enumerate_strategies(MODEL, SPACE).table
    plan = derive_block_plan(MODEL, candidate_to_spec(table, 0, MODEL).mapping)
    ops = block_ops(MODEL, plan.local, attention=plan.attention)
    norm = ops[0]
    twice = (norm, *ops[1:3], norm)

    def lower(split: tuple[int, ...]) -> TaskGroup:
        return distributed._lower_group("block", plan, twice, {}, lambda _: False, split=split)

    _drop_every_memo()
    spanned, whole = lower((2,)), lower(())
    assert spanned == whole
    ids = [t.id for t in whole.tasks if t.phase is Phase.FORWARD]
    assert ids[0] == f"fwd.{norm.name}" and ids[-1] == f"fwd.{norm.name}#2"


def test_a_verified_group_is_checked_again_on_a_mesh_without_its_axes() -> None:
    """The verification memo keeps a group that passed with the axes its collectives use: the
    same group object on a mesh without its ep axis is refused, not waved through."""
    table = enumerate_strategies(MODEL, SPACE).table
    row = _rows_differing_in_ep(table, context=1)[4]
    _drop_every_memo()
    ir = derive_training_block(MODEL, candidate_to_spec(table, row, MODEL).mapping)
    assert ir.moe_block is not None
    assert any(isinstance(t, CollectiveTask) and t.axis == "ep" for t in ir.moe_block.tasks)
    ctx = distributed.PassContext()
    assert distributed.VerifyDistributedTasks().run(ir, ctx) is ir
    without_ep = dataclasses.replace(
        ir, mesh=LogicalMesh(axes=tuple(a for a in ir.mesh.axes if a.name != "ep"))
    )
    with pytest.raises(VerificationError, match="no mesh axis 'ep'"):
        distributed.VerifyDistributedTasks().run(without_ep, ctx)
    ep_of_one = dataclasses.replace(
        ir,
        mesh=LogicalMesh(
            axes=tuple(MeshAxis(name=a.name, size=1) if a.name == "ep" else a for a in ir.mesh.axes)
        ),
    )
    with pytest.raises(VerificationError, match="collective over size 1"):
        distributed.VerifyDistributedTasks().run(ep_of_one, ctx)
