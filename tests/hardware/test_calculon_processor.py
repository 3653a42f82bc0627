"""Calculon's block processing times rebuilt from ``compute_time`` / ``memory_time``.

Reference: ``calculon_oracle_layers.json.gz`` (each layer's FLOPs and HBM bytes per stage) and
``calculon_oracle.json`` stats ``block_{fw,agrad,wgrad,optim}_time``. Calculon
(``calculon/llm/layers.py``, ``Layer.compute_processing_time``) times each layer as
``processing_mode(flops / (peak * eff(flops)), bytes / (hbm * eff(bytes)))``; GEMMs
(``Linear``) and batched GEMMs (``BatchMatMul``) run on the matrix engine except in the
optimizer stage, everything else on the vector engine; TPComm layers (``*_F``, ``*_G``) count
under TP time instead (their ``compute_processing_time`` is 0). Records with tiled TP overlap
use other layers and are left out; BW stages only for training records. Tolerance 1e-9
relative: identical definitions.
"""

from __future__ import annotations

import pytest

from blueprinting.hardware.system import Engine, SystemSpec
from blueprinting.mapping.model import Datatype
from tests.hardware.oracle import integer, number, oracle_layers, oracle_records, table

TOLERANCE = 1e-9
MATRIX_LAYERS = frozenset(
    {"Query", "Key", "Value", "MLP", "Mlp1", "Mlp2", "Multihead_Key_Query", "Multihead_Attn"}
)
TP_COMM_LAYERS = frozenset({"F", "G"})


@pytest.mark.parametrize("stage", ["fw", "agrad", "wgrad", "optim"])
def test_block_times_match_calculon(stage: str) -> None:
    layers_by_id = oracle_layers()
    checked = 0
    mismatches = []
    for record in oracle_records():
        if not record["ok"]:
            continue
        inputs = table(record["inputs"])
        exe = table(inputs["exe"])
        if exe["tensor_par_overlap"] != "none" or (stage != "fw" and not exe["training"]):
            continue
        system = SystemSpec.from_calculon(
            table(inputs["sys"]),
            tensor_par_net=integer(exe["tensor_par_net"]),
            pipeline_par_net=integer(exe["pipeline_par_net"]),
            data_par_net=integer(exe["data_par_net"]),
        )
        datatype = Datatype(str(exe["datatype"]))
        total = 0.0
        for layer in layers_by_id[str(record["id"])]:
            short = str(layer["name"]).split("_", 1)[1]
            if short in TP_COMM_LAYERS:
                continue
            on_matrix = short in MATRIX_LAYERS and stage != "optim"
            total += system.op_time(
                number(layer[f"{stage}_flops"]),
                number(layer[f"{stage}_mem_accessed"]),
                Engine.MATRIX if on_matrix else Engine.VECTOR,
                datatype,
            )
        expected = number(table(table(record["outputs"])["stats"])[f"block_{stage}_time"])
        checked += 1
        if abs(total - expected) > TOLERANCE * abs(expected):
            mismatches.append((record["id"], total, expected))
    assert mismatches == []
    assert checked >= 100
