"""The shared law names: the exact strings the scalar checker and the search report."""

from __future__ import annotations

from blueprinting.errors import RuleSet
from blueprinting.mapping.law_names import MEGATRON_LAWS, PLANNER_LAWS, Law


def test_names_and_rulesets() -> None:
    assert [str(law) for law in PLANNER_LAWS] == [
        "world_size",
        "local_batch",
        "microbatch_count",
        "blocks_per_pipeline_stage",
        "blocks_per_virtual_chunk",
        "sequence_parallel_divisibility",
        "attention_heads_divisibility",
        "query_groups_divisibility",
        "ffn_divisibility",
        "vocab_divisibility",
        "schedule_matches_pipeline",
        "recompute_num_layers_range",
    ]
    assert [str(law) for law in MEGATRON_LAWS] == [
        "megatron_interleaving_min_pipeline",
        "megatron_microbatch_group",
        "megatron_sequence_parallel_needs_tp",
    ]
    assert all(law.ruleset is RuleSet.MEGATRON for law in MEGATRON_LAWS)
    assert all(law.ruleset is RuleSet.PLANNER for law in PLANNER_LAWS)
    assert Law.MEGATRON_MICROBATCH_GROUP.formula == (
        "v > 1 => p <= G <= m and (m mod G == 0 or m mod G >= p), G defaults to p"
    )
    assert all(law.formula for law in Law)
