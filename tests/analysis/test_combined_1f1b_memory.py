"""Combined 1F1B (EP overlap) memory: a paired step stores one layer beyond interleaving's count
(``analysis/memory.StageActivations.paired_forward``; Megatron-Core @d98e8a64)."""

from __future__ import annotations

from blueprinting.analysis.memory import moe_layer_bytes, stage_activations
from blueprinting.mapping.flat_keys import from_mapping
from blueprinting.mapping.presets import model_preset


def test_combined_1f1b_stores_one_layer_beyond_interleaving() -> None:
    """EP overlap without pipelining (``combined_1f1b.py``: "1st microbatch backward + 2nd
    microbatch forward"): the paired step runs forward layer i with backward layer L - 1 - i
    (``model_chunk_schedule_plan.py``, ``pop_layer``), so one microbatch's layers are stored
    and one layer more, not two microbatches; a single microbatch pairs nothing."""
    model = model_preset("qwen3-30b-a3b")  # 48 MoE layers
    keys: dict[str, object] = {
        "world_size": 8,
        "expert_model_parallel_size": 8,
        "moe_token_dispatcher_type": "alltoall",
        "overlap_moe_expert_parallel_comm": True,
        "micro_batch_size": 1,
        "global_batch_size": 16,
        "use_distributed_optimizer": True,
    }
    mapping = from_mapping(keys, model=model).mapping
    acts = stage_activations(model, mapping, 0)
    full, _ = moe_layer_bytes(model, mapping)
    assert acts.in_flight == (1,)
    assert acts.layers_stored == 48 * full
    assert acts.paired_forward == full
    single = from_mapping({**keys, "global_batch_size": 8}, model=model).mapping
    assert stage_activations(model, single, 0).paired_forward == 0
