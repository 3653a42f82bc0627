"""The expert grid's flat keys: Megatron's names and defaults, the refusals of keys a
dispatcher does not read, the inverse and the Megatron-LM flags."""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from blueprinting.errors import ConfigError
from blueprinting.mapping.flat_keys import (
    EXPERT_KEYS,
    from_mapping,
    inference_from_mapping,
    megatron_args_of_lawful,
    to_mapping,
    to_megatron_args,
)
from blueprinting.mapping.presets import model_preset
from blueprinting.mapping.transformer import (
    AllGatherDispatcher,
    AllToAllDispatcher,
    ExpertParallel,
    FlexBackend,
    FlexDispatcher,
    TrainingSpec,
)
from tests.moe_models import DEEPSEEK_V3_LIKE
from tests.strategies import moe_training_specs

BASE: dict[str, object] = {"world_size": 64, "global_batch_size": 512}


def _experts(**keys: object) -> ExpertParallel:
    return from_mapping(BASE | keys, model=DEEPSEEK_V3_LIKE).mapping.parallelism.experts


def _problems(**keys: object) -> tuple[str, ...]:
    with pytest.raises(ConfigError) as raised:
        from_mapping(BASE | keys, model=DEEPSEEK_V3_LIKE)
    return raised.value.problems


def test_megatron_defaults() -> None:
    """Megatron-LM: etp = t (arguments.py l.587-588), allgather, no grouped GEMM."""
    assert _experts(
        expert_model_parallel_size=8, tensor_model_parallel_size=2, sequence_parallel=True
    ) == ExpertParallel(
        degree=8, tensor_degree=2, dispatcher=AllGatherDispatcher(), grouped_gemm=False
    )
    assert _experts() == ExpertParallel(
        degree=1, tensor_degree=1, dispatcher=AllGatherDispatcher(), grouped_gemm=False
    )


def test_every_key_in_megatron_spelling() -> None:
    assert _experts(
        **{
            "--expert-model-parallel-size": 16,
            "--expert-tensor-parallel-size": 1,
            "--moe-token-dispatcher-type": "flex",
            "--moe-flex-dispatcher-backend": "hybridep",
            "--moe-grouped-gemm": True,
            "--overlap-moe-expert-parallel-comm": True,
            "--moe-shared-expert-overlap": False,
        }
    ) == ExpertParallel(
        degree=16,
        tensor_degree=1,
        dispatcher=FlexDispatcher(backend=FlexBackend.HYBRIDEP, overlap=True),
        grouped_gemm=True,
    )
    assert _experts(
        moe_token_dispatcher_type="alltoall", moe_shared_expert_overlap=True
    ).dispatcher == AllToAllDispatcher(shared_expert_overlap=True)


def test_deprecated_moe_enable_deepep() -> None:
    assert _experts(
        moe_token_dispatcher_type="flex", moe_enable_deepep=True, expert_model_parallel_size=8
    ).dispatcher == FlexDispatcher(backend=FlexBackend.DEEPEP)
    assert _problems(moe_enable_deepep=True) == (
        "moe_enable_deepep = true needs moe_token_dispatcher_type = flex, got allgather "
        '(Megatron-LM: "DeepEP backend is only supported with flex token dispatcher")',
    )
    assert _problems(
        moe_enable_deepep=True,
        moe_token_dispatcher_type="flex",
        moe_flex_dispatcher_backend="hybridep",
    ) == (
        "moe_enable_deepep = true selects the deepep backend, which conflicts with "
        "moe_flex_dispatcher_backend = hybridep (Megatron-LM: only one backend is supported "
        "for the flex token dispatcher)",
    )


def test_keys_the_dispatcher_does_not_read_are_refused_all_at_once() -> None:
    assert _problems(
        moe_flex_dispatcher_backend="ncclep",
        overlap_moe_expert_parallel_comm=True,
        moe_shared_expert_overlap=True,
    ) == (
        "moe_flex_dispatcher_backend = ncclep is read only with moe_token_dispatcher_type = "
        "flex, got allgather (Megatron-LM transformer_config.py l.1743-1791)",
        "overlap_moe_expert_parallel_comm = true needs moe_token_dispatcher_type = alltoall or "
        "flex, got allgather (Megatron-LM transformer_config.py l.3002-3071; allgather is "
        "Megatron's default dispatcher)",
        "moe_shared_expert_overlap = true needs moe_token_dispatcher_type = alltoall or flex, "
        "got allgather (Megatron-LM transformer_config.py l.1820-1826; allgather is Megatron's "
        "default dispatcher)",
    )
    assert _problems(
        moe_token_dispatcher_type="alltoall", moe_flex_dispatcher_backend="deepep"
    ) == (
        "moe_flex_dispatcher_backend = deepep is read only with moe_token_dispatcher_type = "
        "flex, got alltoall (Megatron-LM transformer_config.py l.1743-1791)",
    )


def test_misspelt_values_get_a_did_you_mean() -> None:
    assert _problems(moe_token_dispatcher_type="all2all", moe_flex_dispatcher_backend="deepp") == (
        "moe_token_dispatcher_type must be one of alltoall, allgather, flex, got 'all2all' "
        "(did you mean 'alltoall'?)",
        "moe_flex_dispatcher_backend must be one of deepep, hybridep, ncclep, got 'deepp' "
        "(did you mean 'deepep'?)",
    )
    assert _problems(moe_token_dispatcher_typ="flex") == (
        "unknown key 'moe_token_dispatcher_typ' (did you mean 'moe_token_dispatcher_type'?)",
    )


def test_a_dense_model_refuses_the_expert_keys() -> None:
    gpt3 = model_preset("gpt3-175b")
    with pytest.raises(ConfigError) as raised:
        from_mapping(
            BASE | {"expert_tensor_parallel_size": 2, "moe_grouped_gemm": True}, model=gpt3
        )
    assert raised.value.problems == (
        "expert_tensor_parallel_size, moe_grouped_gemm: read only for a mixture-of-experts "
        "model; model 'gpt3-175b' has dense feed-forward layers",
    )
    # ep > 1 is left to the expert_parallel_needs_moe law (reported with the others)
    spec = from_mapping(BASE | {"expert_model_parallel_size": 2}, model=gpt3)
    assert spec.mapping.parallelism.experts == ExpertParallel(degree=2)


def test_serving_takes_ep_but_not_the_training_expert_keys() -> None:
    """Serving runs the experts over the TP group (ServingExpertParallel); the dispatcher and
    grid keys of training are refused by name."""
    keys = {"batch_size": 1, "prompt_length": 128, "generated_tokens": 16}
    spec = inference_from_mapping(
        keys | {"expert_model_parallel_size": 2, "tensor_model_parallel_size": 2},
        model=DEEPSEEK_V3_LIKE,
    )
    assert spec.mapping.expert_degree == 2
    with pytest.raises(ConfigError) as raised:
        inference_from_mapping(keys | {"moe_grouped_gemm": True}, model=DEEPSEEK_V3_LIKE)
    assert raised.value.problems == (
        "key 'moe_grouped_gemm' is a training key: serving runs its experts over the TP group "
        "(expert_model_parallel_size), with no token dispatcher",
    )


_TRAINED = {
    "world_size": 1024,
    "tensor_model_parallel_size": 2,
    "sequence_parallel": True,
    "expert_tensor_parallel_size": 1,
    "pipeline_model_parallel_size": 8,
    "pipeline_model_parallel_layout": "Et|" + "tt|" * 30 + "L",
    "expert_model_parallel_size": 64,
    "moe_token_dispatcher_type": "flex",
    "overlap_moe_expert_parallel_comm": True,
    "moe_grouped_gemm": True,
    "global_batch_size": 8192,
    "use_distributed_optimizer": True,
}


def test_to_mapping_spells_out_every_expert_key() -> None:
    spec = from_mapping(_TRAINED, model=DEEPSEEK_V3_LIKE)
    flat = to_mapping(spec)
    grid = {*EXPERT_KEYS, "expert_model_parallel_size"}
    assert {k: v for k, v in flat.items() if k in grid} == {
        "expert_model_parallel_size": 64,
        "expert_tensor_parallel_size": 1,
        "moe_token_dispatcher_type": "flex",
        "moe_flex_dispatcher_backend": "deepep",
        "moe_grouped_gemm": True,
        "overlap_moe_expert_parallel_comm": True,
        "moe_shared_expert_overlap": False,
        "delay_wgrad_compute": False,
    }
    assert from_mapping(flat, model=DEEPSEEK_V3_LIKE) == spec
    # a dense model writes no expert key
    gpt3 = from_mapping(BASE, model=model_preset("gpt3-175b"))
    assert not [k for k in to_mapping(gpt3) if "expert" in k or k.startswith("moe_")]
    # the model's own MoE keys are written beside the grid's
    assert flat["num_experts"] == 256


def test_megatron_flags_of_the_expert_grid() -> None:
    """DeepSeek-V3 as Megatron's MoE model zoo runs it on 1024 H100 (best_practice readme:
    PP8 VP4 TP2 EP64, flex, the EP overlap)."""
    spec = from_mapping(_TRAINED, model=DEEPSEEK_V3_LIKE)
    args = to_megatron_args(spec)
    start = args.index("--expert-model-parallel-size")
    assert args[start : start + 10] == [
        "--expert-model-parallel-size",
        "64",
        "--expert-tensor-parallel-size",
        "1",
        "--moe-token-dispatcher-type",
        "flex",
        "--moe-flex-dispatcher-backend",
        "deepep",
        "--moe-grouped-gemm",
        "--overlap-moe-expert-parallel-comm",
    ]
    assert "--moe-shared-expert-overlap" not in args
    # Megatron's default dispatcher is written too; switches that are off are not
    allgather = from_mapping({**BASE, "expert_model_parallel_size": 8}, model=DEEPSEEK_V3_LIKE)
    flags = megatron_args_of_lawful(allgather)
    start = flags.index("--expert-model-parallel-size")
    assert flags[start : start + 6] == [
        "--expert-model-parallel-size",
        "8",
        "--expert-tensor-parallel-size",
        "1",
        "--moe-token-dispatcher-type",
        "allgather",
    ]
    assert "--moe-grouped-gemm" not in flags


@settings(max_examples=300, deadline=None)
@given(moe_training_specs())
def test_moe_specs_round_trip_through_flat_keys(spec: TrainingSpec) -> None:
    assert from_mapping(to_mapping(spec), model=spec.model) == spec


def test_the_flex_librarys_sms_are_read_with_their_backend() -> None:
    """``moe_deepep_num_sms`` / ``moe_hybridep_num_sms`` (Megatron-Core defaults 20 and 16): read
    with their own backend only, refused beside another or without flex, all at once; written
    back and emitted as Megatron-LM's flag."""
    from blueprinting.mapping.transformer import flex_sms

    flex = {"moe_token_dispatcher_type": "flex", "expert_model_parallel_size": 8}
    hybrid = _experts(**flex, moe_flex_dispatcher_backend="hybridep", moe_hybridep_num_sms=32)
    assert hybrid.dispatcher == FlexDispatcher(backend=FlexBackend.HYBRIDEP, sms=32)
    assert flex_sms(FlexDispatcher(backend=FlexBackend.HYBRIDEP, sms=32)) == 32
    default = _experts(**flex)
    assert isinstance(default.dispatcher, FlexDispatcher) and flex_sms(default.dispatcher) == 20
    assert flex_sms(FlexDispatcher(backend=FlexBackend.HYBRIDEP)) == 16
    assert flex_sms(FlexDispatcher(backend=FlexBackend.NCCLEP)) is None
    spec = from_mapping(
        BASE | flex | {"moe_flex_dispatcher_backend": "hybridep", "moe_hybridep_num_sms": 32},
        model=DEEPSEEK_V3_LIKE,
    )
    assert to_mapping(spec)["moe_hybridep_num_sms"] == 32
    assert "moe_deepep_num_sms" not in to_mapping(spec)
    args = to_megatron_args(spec)
    assert args[args.index("--moe-hybridep-num-sms") + 1] == "32"
    problems = " | ".join(
        _problems(**flex, moe_flex_dispatcher_backend="hybridep", moe_deepep_num_sms=24)
    )
    assert "moe_deepep_num_sms is read only with moe_flex_dispatcher_backend = deepep" in problems
    alltoall = " | ".join(
        _problems(
            moe_token_dispatcher_type="alltoall", moe_hybridep_num_sms=32, moe_deepep_num_sms=8
        )
    )
    assert "moe_hybridep_num_sms is read only with moe_token_dispatcher_type = flex" in alltoall
    assert "moe_deepep_num_sms is read only with moe_token_dispatcher_type = flex" in alltoall
    zero = " | ".join(_problems(**flex, moe_deepep_num_sms=0))
    assert "moe_deepep_num_sms must be a positive integer, got 0" in zero
    with pytest.raises(ConfigError):
        FlexDispatcher(backend=FlexBackend.NCCLEP, sms=8)
