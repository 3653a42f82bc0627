"""Model FLOPs of mixtures of experts, MLA and MTP under the Megatron-LM / Megatron-Bridge
convention, pinned by hand and against the FLOPs per token Megatron-Bridge's tables imply."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from blueprinting.analysis.flops import (
    FlopsConvention,
    model_flops_per_iteration,
    model_flops_per_token,
    model_forward_flops,
)
from blueprinting.mapping.model import TransformerModelSpec
from blueprinting.mapping.presets import MODEL_PRESETS, model_preset
from tests.reference import shared_reference

_ROWS = Path(__file__).parent / "data" / "megatron_bridge_moe_flops.json"


def test_deepseek_v3_forward_per_token_by_hand() -> None:
    """s = 4096, 61 layers + 1 MTP depth (all per token, forward):
    MLA projections 2 (48,760,320 + 20,906,496 + 117,440,512) per layer; core
    s n (192 + 128) = 4096 * 128 * 320; dense layers (3) 2 * 3 * 7168 * 18432; MoE layers
    (58 + the MTP layer) 8 routed + 1 shared expert of 2048: 2 * 3 * 7168 * 2048 * 9; MTP
    2 (3 h + 2 h^2); LM head 2 h V twice."""
    model = model_preset("deepseek-v3")
    ops = model_forward_flops(model, FlopsConvention.MEGATRON_CAUSAL)
    s = 4096
    assert ops.attention_projections == s * 62 * 2 * 187_107_328
    assert ops.attention_core == 62 * 128 * 320 * s * s
    assert ops.dense_mlp == s * 3 * 6 * 7168 * 18432
    assert ops.routed_experts == s * 59 * 8 * 6 * 7168 * 2048
    assert ops.shared_experts == s * 59 * 6 * 7168 * 2048
    assert ops.mtp_projections == s * 2 * (3 * 7168 + 2 * 7168 * 7168)
    assert ops.logits == s * 2 * 2 * 7168 * 129280
    # 259.99 GFLOP per token for forward + backward, Megatron-Bridge's tables: 259.6-260.6
    assert model_flops_per_token(model, FlopsConvention.MEGATRON_CAUSAL) == pytest.approx(
        259.99e9, rel=1e-4
    )


def test_gpt_oss_window_counts_only_under_megatron_bridge() -> None:
    """18 windowed layers (even i) see W = 129 keys: c (2 s W - W (W - 1)) per sequence,
    c = 2 * 64 * 64 = 8192; the 18 full layers c s^2; megatron-causal counts all 36 full."""
    model = model_preset("gpt-oss-120b")
    s, c, w = 4096, 8192, 129
    bridge = model_forward_flops(model, FlopsConvention.MEGATRON_BRIDGE)
    causal = model_forward_flops(model, FlopsConvention.MEGATRON_CAUSAL)
    assert bridge.attention_core == 18 * c * s * s + 18 * c * (2 * s * w - w * (w - 1))
    assert causal.attention_core == 36 * c * s * s
    assert replace(bridge, attention_core=0) == replace(causal, attention_core=0)
    # no router FLOPs: top-4 experts of 2880 with SwiGLU, 2 * 3 * 2880 * 2880 each
    assert causal.routed_experts == s * 36 * 4 * 6 * 2880 * 2880


def test_dense_model_is_unchanged_by_the_moe_count() -> None:
    """For a model without experts, windows or MTP every per-op convention reduces to the
    layer-uniform count: 3 B (L * block + logits) per token."""
    model = model_preset("llama3-70b")
    bridge = model_flops_per_iteration(model, 8, FlopsConvention.MEGATRON_BRIDGE)
    assert bridge == model_flops_per_iteration(model, 8, FlopsConvention.MEGATRON_CAUSAL)


def test_six_nd_uses_active_parameters() -> None:
    model = model_preset("mixtral-8x7b")
    tokens = 2 * model.seq_length
    assert model_flops_per_iteration(model, 2, FlopsConvention.SIX_ND) == (
        6 * 12_879_925_248 * tokens
    )


def _pre_2606_gpt_oss_flops_per_token(model: TransformerModelSpec) -> float:
    """Megatron-Bridge before 26.06 counted a gated MLP as three GEMMs only when its activation
    was SiLU (flop_utils.py ``gated_linear_multiplier``), so gpt-oss's gated quick-GELU experts
    as two (up and down), and ignored the window: ours under megatron-causal without the gate
    GEMM, one third of the routed-expert FLOPs."""
    ops = model_forward_flops(model, FlopsConvention.MEGATRON_CAUSAL)
    return 3 * (ops.total - ops.routed_experts // 3) / model.seq_length


def _rows() -> list[dict[str, object]]:
    data = json.loads(_ROWS.read_text())
    rows: list[dict[str, object]] = data["rows"]
    return rows


@pytest.mark.parametrize("row", _rows(), ids=lambda row: str(row["id"]))
def test_megatron_bridge_implied_flops_per_token(row: dict[str, object]) -> None:
    """Model TFLOP/s per GPU / tokens/s per GPU = the table's FLOPs per token; ours within 1%."""
    preset = str(row["model_preset"])
    model = replace(
        MODEL_PRESETS[preset],
        seq_length=int(str(row["seq_length"])),
        mtp_num_layers=int(str(row["mtp_num_layers"])),
    )
    implied = (
        1e12 * float(str(row["model_tflops_per_gpu"])) / float(str(row["tokens_per_s_per_gpu"]))
    )
    if row["counter"] == "gated-silu-only":
        ours = _pre_2606_gpt_oss_flops_per_token(model)
    else:
        assert row["counter"] == "megatron-bridge"
        ours = model_flops_per_token(model, FlopsConvention.MEGATRON_BRIDGE)
    assert ours == pytest.approx(implied, rel=0.01)


def test_fixture_covers_every_moe_model_of_the_tables() -> None:
    rows = _rows()
    assert len(rows) == 60
    assert {row["model_preset"] for row in rows} == {"deepseek-v3", "qwen3-30b-a3b", "gpt-oss-120b"}


def test_fixture_matches_shared_modern_runs() -> None:
    reference = shared_reference()
    if reference is None:
        pytest.skip("shared/reference/modern_runs.json not found (set BLUEPRINTING_SHARED)")
    shared = reference / "modern_runs.json"
    measured = {
        record["id"]: record["measured"]
        for record in json.loads(shared.read_text())
        if record["source_key"] == "megatron_bridge_perf_summary_moe"
    }
    for row in _rows():
        figures = measured[row["id"]]
        assert figures["tokens_per_s_per_gpu"] == row["tokens_per_s_per_gpu"]
        assert figures["model_tflops_per_gpu"] == row["model_tflops_per_gpu"]
