"""The formulas written on numbers or columns (hardware/polymorphic.py): evaluated on a column, each
gives, row by row, exactly what it gives on that row's plain numbers (the plan's path)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from blueprinting.analysis.data_parallel import (
    grad_sync_exposed,
    optimizer_sharded_exposure,
    parameter_sharded_exposure,
)
from blueprinting.analysis.memory import (
    block_stored_bytes,
    gathered_whole,
    interleaved_slot,
    precision_recipe,
    state_bytes,
    uniform_stored_bytes,
)
from blueprinting.analysis.pipeline_contract import extra_interleaving_bubbles
from blueprinting.hardware.polymorphic import maximum, minimum, where
from blueprinting.mapping.model import Datatype

small = st.integers(min_value=0, max_value=10**6)
positive = st.integers(min_value=1, max_value=10**4)
seconds = st.floats(min_value=0.0, max_value=10.0, allow_nan=False)


def test_helpers_keep_python_semantics_on_numbers() -> None:
    assert where(True, 3, 4) == 3 and where(False, 3, 4) == 4
    assert minimum(2, 5) == 2 and maximum(2, 5) == 5
    # ties keep the first argument, as min / max do
    assert str(maximum(0.0, -0.0)) == "0.0" and str(maximum(-0.0, 0.0)) == "-0.0"
    assert str(minimum(0.0, -0.0)) == "0.0" and str(minimum(-0.0, 0.0)) == "-0.0"
    assert type(minimum(2**70, 2**71)) is int  # exact beyond int64 on the plan's path
    assert list(where(np.array([True, False]), np.array([1, 2]), np.array([3, 4]))) == [1, 4]


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(
        st.tuples(small, positive, st.integers(0, 3), small, st.booleans()), min_size=1, max_size=6
    )
)
def test_state_bytes_and_gathered_whole_per_row(
    rows: list[tuple[int, int, int, int, bool]],
) -> None:
    recipe = precision_recipe(Datatype.BF16)
    count = np.array([r[0] for r in rows], dtype=np.int64)
    degree = np.array([r[1] for r in rows], dtype=np.int64)
    level = np.array([r[2] for r in rows], dtype=np.int64)
    largest = np.array([r[3] for r in rows], dtype=np.int64)
    ahead = np.array([r[4] for r in rows], dtype=np.bool_)
    gathered = gathered_whole(level, count, largest, ahead)
    columns = state_bytes(count, recipe=recipe, level=level, degree=degree, gathered=gathered)
    for i, (c, d, lv, big, pre) in enumerate(rows):
        g = gathered_whole(lv, c, big, pre)
        assert g == gathered[i]
        plain = state_bytes(c, recipe=recipe, level=lv, degree=d, gathered=g)
        assert plain == tuple(int(part[i]) for part in columns)


@settings(max_examples=60, deadline=None)
@given(m=positive, layers=st.integers(1, 200), group=st.integers(1, 50), ckpt=small, full=small)
def test_recompute_chunks_per_row(m: int, layers: int, group: int, ckpt: int, full: int) -> None:
    col = np.array([m, m + 1], dtype=np.int64)
    lay = np.array([layers, layers], dtype=np.int64)
    grp = np.array([group, group], dtype=np.int64)
    ck = np.array([ckpt, ckpt], dtype=np.int64)
    fu = np.array([full, full], dtype=np.int64)
    assert uniform_stored_bytes(col, lay, grp, ck)[0] == uniform_stored_bytes(
        m, layers, group, ckpt
    )
    assert block_stored_bytes(col, lay, grp, ck, fu)[1] == block_stored_bytes(
        m + 1, layers, group, ckpt, full
    )
    # the block method keeps min(n, L) checkpoints and stores the rest whole
    assert block_stored_bytes(m, layers, group, ckpt, full) == m * (
        min(group, layers) * ckpt + max(layers - group, 0) * full
    )


@settings(max_examples=60, deadline=None)
@given(
    peak=st.integers(1, 400),
    m=positive,
    n=st.integers(1, 16),
    v=st.integers(1, 8),
    index=st.integers(0, 40),
)
def test_interleaved_slot_and_bubbles_per_row(
    peak: int, m: int, n: int, v: int, index: int
) -> None:
    chunk = v - 1
    arrays = [np.array([x, x], dtype=np.int64) for x in (peak, m, n, v, chunk)]
    column = interleaved_slot(
        peak=arrays[0],
        microbatches=arrays[1],
        group=arrays[2],
        virtual=arrays[3],
        index=index,
        chunk=arrays[4],
    )
    plain = interleaved_slot(
        peak=peak, microbatches=m, group=n, virtual=v, index=index, chunk=chunk
    )
    assert column[0] == plain and 0 <= plain <= n
    p = n  # any positive degree
    assert extra_interleaving_bubbles(arrays[2], arrays[3], arrays[1])[
        0
    ] == extra_interleaving_bubbles(p, v, m)


@settings(max_examples=60, deadline=None)
@given(
    total=seconds,
    blocks=st.integers(0, 64),
    v=st.integers(1, 8),
    p=st.integers(1, 16),
    block_bw=seconds,
    chunk_bw=seconds,
    gather=seconds,
    forward=seconds,
    m=st.integers(1, 64),
    grad=st.booleans(),
    param=st.booleans(),
)
def test_dp_exposures_per_row(
    *,
    total: float,
    blocks: int,
    v: int,
    p: int,
    block_bw: float,
    chunk_bw: float,
    gather: float,
    forward: float,
    m: int,
    grad: bool,
    param: bool,
) -> None:
    def col(x: float) -> np.ndarray:
        return np.array([x, x], dtype=np.float64)

    hidden = grad_sync_exposed(
        total,
        blocks_per_chunk=float(blocks),
        virtual_stages=float(v),
        pipeline_degree=float(p),
        block_backward_s=block_bw,
        chunk_backward_s=chunk_bw,
    )
    hidden_col = grad_sync_exposed(
        col(total),
        blocks_per_chunk=col(blocks),
        virtual_stages=col(v),
        pipeline_degree=col(p),
        block_backward_s=col(block_bw),
        chunk_backward_s=col(chunk_bw),
    )
    assert hidden_col[1] == hidden and hidden <= total + 1e-12
    flags = np.array([grad, grad]), np.array([param, param])
    plain = optimizer_sharded_exposure(
        total,
        gather,
        overlap_grad_reduce=grad,
        overlap_param_gather=param,
        hidden=hidden,
        stage_forward_s=forward,
    )
    column = optimizer_sharded_exposure(
        col(total),
        col(gather),
        overlap_grad_reduce=flags[0],
        overlap_param_gather=flags[1],
        hidden=hidden_col,
        stage_forward_s=col(forward),
    )
    assert plain == tuple(float(x[0]) for x in column)
    plain3 = parameter_sharded_exposure(
        total,
        gather,
        microbatches=float(m),
        overlap_grad_reduce=grad,
        overlap_param_gather=param,
        hidden=hidden,
        stage_forward_s=forward,
        chunk_backward_s=chunk_bw,
    )
    column3 = parameter_sharded_exposure(
        col(total),
        col(gather),
        microbatches=col(m),
        overlap_grad_reduce=flags[0],
        overlap_param_gather=flags[1],
        hidden=hidden_col,
        stage_forward_s=col(forward),
        chunk_backward_s=col(chunk_bw),
    )
    assert plain3 == tuple(float(x[0]) for x in column3)


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(st.tuples(st.integers(0, 2**40), positive, st.booleans()), min_size=1, max_size=6)
)
def test_owned_parameters_per_row(rows: list[tuple[int, int, bool]]) -> None:
    """The optimizer step's owned parameters, one formula: ceil(N / degree) when sharded, N
    otherwise, row by row as on plain numbers."""
    from blueprinting.analysis.optimizer_step import owned_parameters

    params = np.array([r[0] for r in rows], dtype=np.int64)
    degree = np.array([r[1] for r in rows], dtype=np.int64)
    sharded = np.array([r[2] for r in rows], dtype=np.bool_)
    column = owned_parameters(params, degree=degree, sharded=sharded)
    for i, (n, d, s) in enumerate(rows):
        plain = owned_parameters(n, degree=d, sharded=s)
        assert plain == int(column[i]) == (-(-n // d) if s else n)


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(
        st.tuples(positive, positive, positive, positive, st.integers(0, 3), small, small),
        min_size=1,
        max_size=6,
    )
)
def test_interleaved_groups_and_mtp_depths_per_row(
    rows: list[tuple[int, int, int, int, int, int, int]],
) -> None:
    """The interleaved table's reached groups and an MTP depth's stored bytes (recompute
    variants: 0 none, 1 selective, 2 full uniform, 3 full block), one formula on a row's numbers
    and on columns."""
    from blueprinting.analysis.memory import interleaved_group_reached, mtp_depth_stored_bytes

    group, m, v, peak, variant, full, kept = (
        np.array([r[k] for r in rows], dtype=np.int64) for k in range(7)
    )
    for index in range(3):
        column = interleaved_group_reached(
            index=index, group=group, microbatches=m, virtual=v, peak=peak
        )
        for i, (g, mm, vv, pk, *_) in enumerate(rows):
            plain = interleaved_group_reached(
                index=index, group=g, microbatches=mm, virtual=vv, peak=pk
            )
            assert plain == bool(np.asarray(column)[i]) == (index * g < mm and index * g * vv < pk)
    depth = mtp_depth_stored_bytes(
        selective=variant == 1,
        uniform=variant == 2,
        full_layer=full,
        kept_layer=kept,
        micro_batch=group,
        rows=m,
        hidden=8,
        activation=2,
    )
    for i, (b, s, _, _, var, f, k) in enumerate(rows):
        depth_plain = mtp_depth_stored_bytes(
            selective=var == 1,
            uniform=var == 2,
            full_layer=f,
            kept_layer=k,
            micro_batch=b,
            rows=s,
            hidden=8,
            activation=2,
        )
        assert depth_plain == int(depth[i])
        # MTP_CHECKPOINT_TENSORS = 2, MTP_HIDDEN_TENSORS = 5 tensors of 2-byte rows x 8
        expected = 2 * 2 * b * s * 8 if var == 2 else (k if var == 1 else f) + 5 * 2 * b * s * 8
        assert depth_plain == expected
