"""CUDA graphs in the strategy: the flat keys both ways, the Megatron flags, and the start-up
laws (Megatron-LM ``megatron/training/arguments.py`` @307dcf37, ``validate_args``)."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from blueprinting.errors import ConfigError
from blueprinting.mapping.cuda_graphs import (
    CudaGraphScope,
    LocalCudaGraphs,
    NoCudaGraphs,
    TransformerEngineCudaGraphs,
    captured_scopes,
)
from blueprinting.mapping.flat_keys import from_mapping, to_mapping, to_megatron_args
from blueprinting.mapping.law_names import CUDA_GRAPH_LAWS, Law
from blueprinting.mapping.laws import check_training
from blueprinting.mapping.presets import model_preset
from blueprinting.mapping.transformer import TrainingSpec

_QWEN = model_preset("qwen3-30b-a3b")
_DENSE = model_preset("llama3-8b")
_BASE: dict[str, object] = {
    "world_size": 8,
    "expert_model_parallel_size": 8,
    "micro_batch_size": 1,
    "global_batch_size": 64,
    "moe_token_dispatcher_type": "alltoall",
}


def _spec(**keys: object) -> TrainingSpec:
    return from_mapping({**_BASE, **keys}, model=_QWEN)


def _laws(spec: TrainingSpec) -> set[str]:
    return {v.law for v in check_training(spec.model, spec.mapping)}


def test_default_is_no_cuda_graphs_and_writes_no_key() -> None:
    spec = _spec()
    assert spec.mapping.cuda_graphs == NoCudaGraphs()
    assert not any("cuda" in key for key in to_mapping(spec))
    assert not any("cuda-graph" in arg for arg in to_megatron_args(spec))


@pytest.mark.parametrize(
    ("keys", "graphs"),
    [
        (
            {"cuda_graph_impl": "transformer_engine", "cuda_graph_scope": "attn moe_router"},
            TransformerEngineCudaGraphs(
                scope=frozenset({CudaGraphScope.ATTN, CudaGraphScope.MOE_ROUTER})
            ),
        ),
        (
            {"cuda_graph_impl": "local", "cuda_graph_scope": "full_iteration"},
            LocalCudaGraphs(scope=frozenset({CudaGraphScope.FULL_ITERATION})),
        ),
        ({"enable_cuda_graph": True}, LocalCudaGraphs()),
        ({"external_cuda_graph": True}, TransformerEngineCudaGraphs()),
        ({"cuda_graph_impl": "none"}, NoCudaGraphs()),
    ],
)
def test_keys_read_to_the_adt_and_back(
    keys: Mapping[str, object], graphs: LocalCudaGraphs | TransformerEngineCudaGraphs | NoCudaGraphs
) -> None:
    spec = _spec(**keys)
    assert spec.mapping.cuda_graphs == graphs
    again = from_mapping(to_mapping(spec), model=_QWEN)
    assert again.mapping == spec.mapping


def test_megatron_flags_name_the_impl_and_each_scope() -> None:
    spec = _spec(
        cuda_graph_impl="transformer_engine", cuda_graph_scope="moe_preprocess,attn, moe_router"
    )
    args = to_megatron_args(spec)
    i = args.index("--cuda-graph-impl")
    # the scope in Megatron's enum order, one argument per name
    assert args[i : i + 6] == [
        "--cuda-graph-impl",
        "transformer_engine",
        "--cuda-graph-scope",
        "attn",
        "moe_router",
        "moe_preprocess",
    ]


def test_bad_keys_are_reported_together() -> None:
    with pytest.raises(ConfigError) as caught:
        _spec(cuda_graph_scope="atn", enable_cuda_graph=True, external_cuda_graph=True)
    text = str(caught.value)
    assert "unknown scope 'atn'" in text and "did you mean 'attn'" in text
    assert "enable_cuda_graph = true and external_cuda_graph = true" in text


def test_a_legacy_flag_that_disagrees_with_the_impl_is_refused() -> None:
    with pytest.raises(ConfigError, match="enable_cuda_graph = true means cuda_graph_impl = local"):
        _spec(enable_cuda_graph=True, cuda_graph_impl="transformer_engine")


def test_a_scope_without_an_impl_is_refused() -> None:
    with pytest.raises(ConfigError, match="needs cuda_graph_impl = local or transformer_engine"):
        _spec(cuda_graph_scope="attn")


def test_megatron_default_scope_for_transformer_engine() -> None:
    """``attn moe`` when every layer is MoE, ``attn mlp`` for a dense model (validate_args)."""
    assert captured_scopes(TransformerEngineCudaGraphs(), _QWEN) == {
        CudaGraphScope.ATTN,
        CudaGraphScope.MOE,
    }
    assert captured_scopes(TransformerEngineCudaGraphs(), _DENSE) == {
        CudaGraphScope.ATTN,
        CudaGraphScope.MLP,
    }
    deepseek = model_preset("deepseek-v3")  # three dense layers first
    assert captured_scopes(LocalCudaGraphs(), deepseek) == {
        CudaGraphScope.ATTN,
        CudaGraphScope.MLP,
        CudaGraphScope.MOE,
    }


def test_every_violated_scope_law_is_reported_at_once() -> None:
    spec = _spec(
        moe_token_dispatcher_type="flex",
        cuda_graph_impl="transformer_engine",
        cuda_graph_scope="moe moe_router moe_preprocess mlp full_iteration mamba",
        recompute_granularity="full",
        recompute_method="uniform",
        recompute_num_layers=1,
    )
    assert {
        Law.CUDA_GRAPH_SCOPE_NEEDS_LAYER.value,
        Law.MEGATRON_CUDA_GRAPH_FULL_RECOMPUTE.value,
        Law.MEGATRON_CUDA_GRAPH_TE_FULL_ITERATION.value,
        Law.MEGATRON_CUDA_GRAPH_MOE_AND_ROUTER.value,
        Law.MEGATRON_CUDA_GRAPH_MLP_NEEDS_DENSE_LAYER.value,
        Law.MEGATRON_CUDA_GRAPH_MOE_STATIC_SHAPES.value,
    } <= _laws(spec)


def test_the_recipes_scopes_are_lawful() -> None:
    """Megatron-Bridge's TE scopes on the dropless alltoall / flex rows start."""
    for dispatcher in ("alltoall", "flex"):
        spec = _spec(
            moe_token_dispatcher_type=dispatcher,
            cuda_graph_impl="transformer_engine",
            cuda_graph_scope="attn moe_router moe_preprocess",
        )
        assert not _laws(spec) & {law.value for law in CUDA_GRAPH_LAWS}


def test_moe_scope_needs_drop_and_pad_under_alltoall() -> None:
    moe = Law.MEGATRON_CUDA_GRAPH_MOE_STATIC_SHAPES.value
    assert moe in _laws(_spec(cuda_graph_impl="transformer_engine", cuda_graph_scope="attn moe"))
    padded = _spec(
        cuda_graph_impl="transformer_engine",
        cuda_graph_scope="attn moe",
        moe_expert_capacity_factor=1.0,
        moe_pad_expert_input_to_capacity=True,
    )
    assert moe not in _laws(padded)
    # a capacity factor without padding copies the counts to the host in the preprocess
    unpadded = _spec(
        cuda_graph_impl="transformer_engine",
        cuda_graph_scope="moe_router moe_preprocess",
        moe_expert_capacity_factor=1.0,
    )
    assert Law.MEGATRON_CUDA_GRAPH_PREPROCESS_SYNC.value in _laws(unpadded)


def test_local_takes_full_iteration_or_nothing() -> None:
    bad = _spec(cuda_graph_impl="local", cuda_graph_scope="attn")
    assert Law.MEGATRON_CUDA_GRAPH_LOCAL_SCOPE.value in _laws(bad)
    good = _spec(cuda_graph_impl="local", cuda_graph_scope="full_iteration")
    assert not _laws(good) & {law.value for law in CUDA_GRAPH_LAWS}


def test_dense_model_refuses_moe_scopes() -> None:
    spec = from_mapping(
        {
            "world_size": 8,
            "micro_batch_size": 1,
            "global_batch_size": 64,
            "cuda_graph_impl": "transformer_engine",
            "cuda_graph_scope": "attn moe_router",
        },
        model=_DENSE,
    )
    assert Law.MEGATRON_CUDA_GRAPH_MOE_SCOPE_NEEDS_MOE.value in _laws(spec)


def test_the_search_applies_no_cuda_graph_law() -> None:
    assert not any(law.searched for law in CUDA_GRAPH_LAWS)


def test_the_graphs_of_flat_keys_read_as_from_mapping_reads_them() -> None:
    """``cuda_graphs_from_keys``: the validation tables' reading, the same variant the full
    adapter builds, every problem at once, a bad implementation named."""
    from blueprinting.mapping.flat_keys import cuda_graphs_from_keys

    keys = {"cuda_graph_impl": "transformer_engine", "cuda_graph_scope": "moe_router attn"}
    assert cuda_graphs_from_keys(keys) == _spec(**keys).mapping.cuda_graphs
    assert str(cuda_graphs_from_keys(keys)) == "transformer_engine(attn moe_router)"
    assert cuda_graphs_from_keys({"enable_cuda_graph": True}) == LocalCudaGraphs()
    assert cuda_graphs_from_keys({}) == NoCudaGraphs()
    with pytest.raises(ConfigError) as raised:
        cuda_graphs_from_keys({"cuda_graph_scope": "full_iteration"})
    assert raised.value.problems == (
        "cuda_graph_scope = 'full_iteration' needs cuda_graph_impl = local or "
        "transformer_engine (cuda_graph_impl is none)",
    )
    with pytest.raises(ConfigError) as misspelt:
        cuda_graphs_from_keys({"cuda_graph_impl": "loacl", "enable_cuda_graph": "yes"})
    assert misspelt.value.problems == (
        "cuda_graph_impl must be one of none, local, transformer_engine, got 'loacl' (did you "
        "mean 'local'?)",
        "enable_cuda_graph must be a boolean, got 'yes' (str)",
    )
