"""Calculon's communication times rebuilt from Blueprinting's collective costs.

Reference: ``shared/reference/calculon_oracle.json`` (Calculon caa4b11 outputs, see
``calculon_oracle.md``) and its per-layer file. For every record:

* ``block_dp_time`` (internal): one all-reduce of ``block_dp_size`` bytes over the DP group on
  ``data_par_net``, or a reduce-scatter plus an all-gather with ``optimizer_sharding``
  (Calculon ``Llm._compute_batch_stats``); records rejected for memory use their
  ``outputs_ignoring_mem_cap``.
* ``{base,edge}block_{fw,agrad}_tp_time``: over the block's TPComm layers (``*_F``, ``*_G``;
  ``_G`` is the conjugate one, after the row-parallel GEMM), the collective on
  ``tensor_par_net`` plus the layer's own processing time (its reduction adds) on the vector
  engine (Calculon ``TPComm.compute_net_time``). Sequence parallelism (``rs_ag``, and the edge
  block of ``p2p_rs_ag``) splits each all-reduce into RS/AG. Records with tiled TP overlap
  (``tensor_par_overlap`` != none) define these times differently and are left out; so are
  agrad times of inference records (Calculon leaves them 0).

All must agree to 1e-9 relative: the definitions are identical.
"""

from __future__ import annotations

import pytest

from blueprinting.hardware.collectives import CollectiveKind
from blueprinting.hardware.system import CommGroup, Engine, ParallelDim, SystemSpec
from blueprinting.mapping.model import Datatype
from tests.hardware.oracle import Json, integer, number, oracle_layers, oracle_records, table

TOLERANCE = 1e-9


def _outputs(record: Json) -> Json | None:
    if record["ok"]:
        return table(record["outputs"])
    error = table(record["error"])
    ignoring = error.get("outputs_ignoring_mem_cap")
    return None if ignoring is None else table(ignoring)


def _system(record: Json) -> SystemSpec:
    inputs = table(record["inputs"])
    exe = table(inputs["exe"])
    return SystemSpec.from_calculon(
        table(inputs["sys"]),
        tensor_par_net=integer(exe["tensor_par_net"]),
        pipeline_par_net=integer(exe["pipeline_par_net"]),
        data_par_net=integer(exe["data_par_net"]),
    )


def _group(system: SystemSpec, exe: Json, dim: ParallelDim) -> CommGroup:
    return system.comm_group(
        dim,
        tensor=integer(exe["tensor_par"]),
        pipeline=integer(exe["pipeline_par"]),
        data=integer(exe["data_par"]),
    )


def _close(actual: float, expected: float) -> bool:
    return abs(actual - expected) <= TOLERANCE * abs(expected) or actual == expected


def test_block_dp_time_matches_calculon() -> None:
    checked = 0
    mismatches = []
    for record in oracle_records():
        outputs = _outputs(record)
        if outputs is None:
            continue
        exe = table(table(record["inputs"])["exe"])
        stats, internal = table(outputs["stats"]), table(outputs["internal"])
        system = _system(record)
        group = _group(system, exe, ParallelDim.DATA)
        size = number(stats["block_dp_size"])
        if group.size > 1 and exe["training"]:
            if exe["optimizer_sharding"]:
                expected = system.collective_time(
                    CollectiveKind.REDUCE_SCATTER, size, group
                ) + system.collective_time(CollectiveKind.ALL_GATHER, size, group)
            else:
                expected = system.collective_time(CollectiveKind.ALL_REDUCE, size, group)
        else:
            expected = 0.0
        checked += 1
        if not _close(expected, number(internal["block_dp_time"])):
            mismatches.append((record["id"], expected, internal["block_dp_time"]))
    assert mismatches == []
    assert checked >= 300  # 304 records have outputs at the time of writing


def _tp_kind(
    comm_type: str, conjugate: bool, forward: bool, baseblock: bool
) -> CollectiveKind | None:
    split = comm_type == "rs_ag" or (comm_type == "p2p_rs_ag" and not baseblock)
    if split:
        # G (conjugate) reduce-scatters forward and all-gathers backward; F the reverse.
        if conjugate == forward:
            return CollectiveKind.REDUCE_SCATTER
        return CollectiveKind.ALL_GATHER
    # Without SP: G all-reduces forward (identity backward), F all-reduces backward.
    return CollectiveKind.ALL_REDUCE if conjugate == forward else None


@pytest.mark.parametrize("stage", ["fw", "agrad"])
@pytest.mark.parametrize("baseblock", [True, False], ids=["baseblock", "edgeblock"])
def test_tp_times_match_calculon(stage: str, baseblock: bool) -> None:
    layers_by_id = oracle_layers()
    checked = 0
    mismatches = []
    for record in oracle_records():
        if not record["ok"]:
            continue
        exe = table(table(record["inputs"])["exe"])
        if exe["tensor_par_overlap"] != "none" or (stage == "agrad" and not exe["training"]):
            continue
        stats = table(table(record["outputs"])["stats"])
        system = _system(record)
        group = _group(system, exe, ParallelDim.TENSOR)
        datatype = Datatype(str(exe["datatype"]))
        block = "baseblock" if baseblock else "edgeblock"
        size_key = f"{block}_{'fw' if stage == 'fw' else 'bw'}_tp_comm_size"
        total = 0.0
        for layer in layers_by_id[str(record["id"])]:
            short = str(layer["name"]).split("_", 1)[1]
            if short not in ("F", "G") or group.size == 1:
                continue
            kind = _tp_kind(
                str(exe["tensor_par_comm_type"]), short == "G", stage == "fw", baseblock
            )
            net = (
                0.0
                if kind is None
                else system.collective_time(kind, number(layer[size_key]), group)
            )
            reduction = system.op_time(
                number(layer[f"{stage}_flops"]),
                number(layer[f"{stage}_mem_accessed"]),
                Engine.VECTOR,
                datatype,
            )
            total += net + reduction
        checked += 1
        expected = number(stats[f"{block}_{stage}_tp_time"])
        if not _close(total, expected):
            mismatches.append((record["id"], total, expected))
    assert mismatches == []
    assert checked >= 100


def test_pp_p2p_time_matches_calculon() -> None:
    """``pp_comm_link_time = nmb * v * (p2p(block_fw_pp_size) + p2p(block_bw_pp_size))`` on
    ``pipeline_par_net`` when p > 1 (no backward send for inference), Calculon
    ``Llm._compute_batch_stats``."""
    checked = 0
    mismatches = []
    for record in oracle_records():
        outputs = _outputs(record)
        if outputs is None:
            continue
        exe = table(table(record["inputs"])["exe"])
        stats, internal = table(outputs["stats"]), table(outputs["internal"])
        system = _system(record)
        group = _group(system, exe, ParallelDim.PIPELINE)
        if group.size == 1:
            continue
        per_chunk = system.collective_time(
            CollectiveKind.P2P, number(stats["block_fw_pp_size"]), group
        )
        if exe["training"]:
            per_chunk += system.collective_time(
                CollectiveKind.P2P, number(stats["block_bw_pp_size"]), group
            )
        expected = (
            number(internal["num_microbatches"]) * number(internal["chunks_per_proc"]) * per_chunk
        )
        checked += 1
        if not _close(expected, number(stats["pp_comm_link_time"])):
            mismatches.append((record["id"], expected, stats["pp_comm_link_time"]))
    assert mismatches == []
    assert checked >= 200
