"""The seed's analytic bubble contract: hand values, and identity with Calculon's bubble_time."""

from __future__ import annotations

import json

import pytest

from blueprinting.analysis.pipeline_contract import (
    analytic_bubble,
    extra_interleaving_bubbles,
    imbalance_correction,
)
from blueprinting.validation.calculon import default_oracle_path


def test_contract_hand_values() -> None:
    # p=8, v=3, m=64: 64 mod 8 = 0, so n_bubble = 7 and T_bubble = 7 * (0.02 + 0.04).
    contract = analytic_bubble(p=8, v=3, m=64, forward_chunk_s=0.02, backward_chunk_s=0.04)
    assert contract.n_bubble == 7
    assert contract.bubble_s == pytest.approx(7 * 0.06, rel=1e-15)


def test_extra_interleaving_term_hand_values() -> None:
    # m mod p = 10 mod 4 = 2 -> (v - 1) * (p - 2) = 2 * 2.
    assert extra_interleaving_bubbles(4, 3, 10) == 4
    assert extra_interleaving_bubbles(4, 3, 12) == 0
    assert extra_interleaving_bubbles(4, 1, 10) == 0
    contract = analytic_bubble(
        p=4, v=3, m=10, forward_chunk_s=1.0, backward_chunk_s=2.0, imbalance_correction_s=0.5
    )
    assert contract.n_bubble == 3 + 4
    assert contract.bubble_s == 7 * 3.0 - 0.5


def test_imbalance_correction_counts_missing_blocks() -> None:
    # L = 5 on p = 4 stages of at most 2 blocks: 4*2 - 5 = 3 missing blocks.
    assert imbalance_correction(p=4, max_blocks_per_stage=2, total_blocks=5, block_fw_bw_s=3.0) == 9


def test_contract_equals_calculon_bubble_time_on_every_record() -> None:
    """Fed Calculon's chunk times, the contract reproduces Calculon's bubble_time (same formula;
    source: calculon/llm/llm.py at caa4b11, the oracle's version)."""
    path = default_oracle_path()
    if path is None:
        pytest.skip("calculon_oracle.json not found (set BLUEPRINTING_CALCULON_ORACLE)")
    records = [
        r for r in json.loads(path.read_text()) if r["ok"] and r["inputs"]["exe"]["training"]
    ]
    assert records, "the oracle holds no successful training record"
    mismatches = []
    for record in records:
        exe, internal = record["inputs"]["exe"], record["outputs"]["internal"]
        base, edge = internal["baseblocks_per_chunk"], internal["edgeblocks_per_chunk"]
        fw = base * internal["baseblock_fw_time"] + edge * internal["edgeblock_fw_time"]
        bw = base * internal["baseblock_bw_time"] + edge * internal["edgeblock_bw_time"]
        # Calculon removes the missing blocks' average of a base and an edge block, or a whole
        # edge block when a chunk has no base block.
        if base > 0:
            per_missing = (
                internal["baseblock_fw_time"]
                + internal["edgeblock_fw_time"]
                + internal["baseblock_bw_time"]
                + internal["edgeblock_bw_time"]
            ) / 2
        else:
            per_missing = internal["edgeblock_fw_time"] + internal["edgeblock_bw_time"]
        correction = internal["bubble_reduction_blocks"] * per_missing
        contract = analytic_bubble(
            p=exe["pipeline_par"],
            v=exe["pipeline_interleaving"],
            m=internal["num_microbatches"],
            forward_chunk_s=fw,
            backward_chunk_s=bw,
            imbalance_correction_s=correction,
        )
        expected = record["outputs"]["stats"]["bubble_time"]
        if contract.bubble_s != pytest.approx(expected, rel=1e-12, abs=1e-15):
            mismatches.append((record["id"], contract.bubble_s, expected))
    assert not mismatches, mismatches[:10]
