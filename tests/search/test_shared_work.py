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
from blueprinting.synthesizer.dialects.transformer.training import placements
from blueprinting.synthesizer.dialects.transformer.training_derivation import (
    derive_training_block,
)
from blueprinting.synthesizer.stages.distributed import passes as distributed
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
