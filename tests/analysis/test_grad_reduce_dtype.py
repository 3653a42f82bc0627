"""The gradient reduction datatype (``DataParallel.grad_reduce_dtype``): its flat keys both ways,
the refusals of contradictory keys, and its exact effects on gradient buffers, the fp32 main-grad
copy, DP bytes and the Adam step (Megatron-LM ``arguments.py`` l.1204-1217,
``param_and_grad_buffer.py`` ``group_params_for_buffers``, ``optimizer.py`` /
``distrib_optimizer.py`` ``_copy_model_grads_to_main_grads`` @d98e8a64)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from blueprinting.analysis.evaluate import PlanOptions
from blueprinting.analysis.iteration import BubbleSource
from blueprinting.analysis.memory import (
    MemoryPeak,
    memory_per_stage,
    precision_recipe,
    stage_parameters,
)
from blueprinting.api import plan_spec
from blueprinting.errors import ConfigError
from blueprinting.hardware.presets import system_preset
from blueprinting.mapping.model import Datatype
from blueprinting.mapping.presets import model_preset
from blueprinting.mapping.transformer import (
    GradReduceDtype,
    TrainingSpec,
    from_mapping,
    grad_reduce_datatype,
    to_mapping,
    to_megatron_args,
)

GB = 80 * 10**9
KEYS: dict[str, object] = {
    "tensor_model_parallel_size": 2,
    "pipeline_model_parallel_size": 2,
    "data_parallel_size": 4,
    "use_distributed_optimizer": True,
    "overlap_grad_reduce": True,
    "micro_batch_size": 1,
    "global_batch_size": 32,
}


def _spec(**extra: object) -> TrainingSpec:
    return from_mapping({**KEYS, **extra}, model=model_preset("llama3-8b"))


@pytest.mark.parametrize(
    ("datatype", "choice", "grad", "main_grad", "total"),
    [
        # Megatron-LM's table (dist_optimizer.md): bf16 18 B, fp16 20 B, fp32 16 B
        (Datatype.BF16, GradReduceDtype.DEFAULT, 4, 0, 18),
        (Datatype.BF16, GradReduceDtype.FP32, 4, 0, 18),
        # bf16 buffers: fp16's row, 2 + 2 + (4 + 4 + 8)
        (Datatype.BF16, GradReduceDtype.PARAMS, 2, 4, 20),
        (Datatype.FP8, GradReduceDtype.DEFAULT, 4, 0, 18),
        (Datatype.FP8, GradReduceDtype.PARAMS, 2, 4, 20),
        (Datatype.FP16, GradReduceDtype.DEFAULT, 2, 4, 20),
        (Datatype.FP16, GradReduceDtype.PARAMS, 2, 4, 20),
        # --accumulate-allreduce-grads-in-fp32 under --fp16: the fp32 buffer is the main grad
        (Datatype.FP16, GradReduceDtype.FP32, 4, 0, 18),
        (Datatype.FP32, GradReduceDtype.DEFAULT, 4, 0, 16),
        (Datatype.FP32, GradReduceDtype.PARAMS, 4, 0, 16),
    ],
)
def test_recipe_bytes_per_parameter(
    datatype: Datatype, choice: GradReduceDtype, grad: int, main_grad: int, total: int
) -> None:
    recipe = precision_recipe(datatype, choice)
    assert (recipe.grad, recipe.main_grad, recipe.total) == (grad, main_grad, total)
    assert recipe.param == precision_recipe(datatype).param
    assert grad_reduce_datatype(datatype, choice).bytes == grad


@pytest.mark.parametrize(
    ("extra", "choice"),
    [
        ({}, GradReduceDtype.DEFAULT),
        ({"grad_reduce_in_fp32": True}, GradReduceDtype.FP32),
        ({"grad_reduce_in_fp32": False}, GradReduceDtype.PARAMS),
        ({"accumulate_allreduce_grads_in_fp32": True}, GradReduceDtype.FP32),
        ({"accumulate_allreduce_grads_in_fp32": False}, GradReduceDtype.DEFAULT),
        ({"grad_reduce_in_bf16": True}, GradReduceDtype.PARAMS),
        ({"grad_reduce_in_bf16": False}, GradReduceDtype.DEFAULT),
        ({"grad_reduce_in_fp32": False, "grad_reduce_in_bf16": True}, GradReduceDtype.PARAMS),
        (
            {"grad_reduce_in_fp32": True, "accumulate_allreduce_grads_in_fp32": True},
            GradReduceDtype.FP32,
        ),
        # bf16 training without --grad-reduce-in-bf16 reduces in fp32: the same datatype
        ({"grad_reduce_in_fp32": True, "grad_reduce_in_bf16": False}, GradReduceDtype.FP32),
    ],
)
def test_from_mapping_reads_every_spelling_and_round_trips(
    extra: dict[str, object], choice: GradReduceDtype
) -> None:
    spec = _spec(**extra)
    assert spec.mapping.parallelism.data.grad_reduce_dtype is choice
    assert from_mapping(to_mapping(spec), model=spec.model).mapping == spec.mapping


def test_to_mapping_and_megatron_args_spell_megatron_lm_flags() -> None:
    bf16 = _spec(grad_reduce_in_fp32=False)
    keys = to_mapping(bf16)
    assert keys["grad_reduce_in_bf16"] is True
    assert "grad_reduce_in_fp32" not in keys and "accumulate_allreduce_grads_in_fp32" not in keys
    assert "--grad-reduce-in-bf16" in to_megatron_args(bf16)
    fp32 = _spec(grad_reduce_in_fp32=True)
    assert to_mapping(fp32)["accumulate_allreduce_grads_in_fp32"] is True
    # fp32 is Megatron-LM's default for bf16 training: no flag needed
    args = to_megatron_args(fp32)
    assert "--grad-reduce-in-bf16" not in args
    assert "--accumulate-allreduce-grads-in-fp32" not in args
    default = _spec()
    three = {"grad_reduce_in_fp32", "accumulate_allreduce_grads_in_fp32", "grad_reduce_in_bf16"}
    assert three.isdisjoint(to_mapping(default))
    assert to_megatron_args(default) == args


def test_fp16_training_spells_its_own_default() -> None:
    fp16 = _spec(fp16=True, bf16=False, accumulate_allreduce_grads_in_fp32=True)
    assert grad_reduce_datatype(fp16.model.datatype, GradReduceDtype.DEFAULT) is Datatype.FP16
    assert "--accumulate-allreduce-grads-in-fp32" in to_megatron_args(fp16)
    params = _spec(fp16=True, bf16=False, grad_reduce_in_fp32=False)
    assert to_mapping(params)["grad_reduce_in_fp32"] is False
    assert from_mapping(to_mapping(params), model=params.model).mapping == params.mapping
    assert "--grad-reduce-in-bf16" not in to_megatron_args(params)


def test_megatron_fsdp_is_told_the_datatype() -> None:
    fsdp = {"use_megatron_fsdp": True, "data_parallel_sharding_strategy": "optim_grads_params"}
    keys = {k: v for k, v in KEYS.items() if k != "use_distributed_optimizer"}
    default = from_mapping({**keys, **fsdp}, model=model_preset("llama3-8b"))
    args = to_megatron_args(default)
    at = args.index("--megatron-fsdp-main-grads-dtype")
    assert args[at + 1] == "fp32"
    bf16 = from_mapping(
        {**keys, **fsdp, "grad_reduce_in_bf16": True}, model=model_preset("llama3-8b")
    )
    args = to_megatron_args(bf16)
    assert args[args.index("--megatron-fsdp-main-grads-dtype") + 1] == "bf16"


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (
            {"grad_reduce_in_fp32": True, "grad_reduce_in_bf16": True},
            ("grad_reduce_in_fp32 = true", "grad_reduce_in_bf16 = true"),
        ),
        (
            {"grad_reduce_in_fp32": False, "accumulate_allreduce_grads_in_fp32": True},
            ("grad_reduce_in_fp32 = false", "accumulate_allreduce_grads_in_fp32 = true"),
        ),
        (
            {"grad_reduce_in_fp32": False, "grad_reduce_in_bf16": False},
            ("grad_reduce_in_fp32 = false", "grad_reduce_in_bf16 = false"),
        ),
        (
            {"accumulate_allreduce_grads_in_fp32": True, "grad_reduce_in_bf16": True},
            ("accumulate_allreduce_grads_in_fp32 = true", "grad_reduce_in_bf16 = true"),
        ),
        (
            {"grad_reduce_in_bf16": True, "fp16": True, "bf16": False},
            ("grad_reduce_in_bf16 = true", "float16"),
        ),
    ],
)
def test_contradictory_keys_are_refused_naming_both(
    extra: dict[str, object], named: tuple[str, str]
) -> None:
    with pytest.raises(ConfigError) as caught:
        _spec(**extra)
    text = str(caught.value)
    assert all(part in text for part in named), text


def test_gradient_and_optimizer_bytes_exact() -> None:
    """Gradient buffers of 2 vs 4 bytes per parameter; the distributed optimizer's shard gains
    the 4-byte main-grad copy at the step (Megatron's table: ceil(N 16 / d) vs ceil(N 12 / d)),
    counted apart from the optimizer states, which hold ceil(N 12 / d) either way: the copy is
    made at the step and freed before the next forward, so the backward's peak, where the
    activations are, never holds it."""
    fp32, bf16 = _spec(), _spec(grad_reduce_in_fp32=False)
    d = fp32.mapping.dense_gradient_degree
    assert d == 4
    for stage, (a, b) in enumerate(
        zip(
            memory_per_stage(fp32.model, fp32.mapping, capacity_bytes=GB),
            memory_per_stage(bf16.model, bf16.mapping, capacity_bytes=GB),
            strict=True,
        )
    ):
        n = stage_parameters(fp32.model, fp32.mapping, stage).dense_total
        assert (a.gradients, b.gradients) == (4 * n, 2 * n)
        assert (a.optimizer_states, b.optimizer_states) == (
            math.ceil(12 * n / d),
            math.ceil(12 * n / d),
        )
        assert (a.optimizer_step_copy, b.optimizer_step_copy) == (0, math.ceil(4 * n / d))
        assert b.optimizer_states + b.optimizer_step_copy == math.ceil(16 * n / d)
        assert a.weights == b.weights
        assert a.activations == b.activations
        assert a.nccl_buffers == b.nccl_buffers
        assert a.total - b.total == 2 * n
        # the backward sets the peak here: the copy is smaller than what the step frees
        assert b.peak is not MemoryPeak.OPTIMIZER_STEP
        assert b.allocated_peak == b.total + b.transient + b.workspace


def test_data_parallel_and_optimizer_step_bytes_exact() -> None:
    system = system_preset("dgx-h100")
    options = PlanOptions(bubble_source=BubbleSource.CONTRACT)
    fp32, bf16 = _spec(), _spec(grad_reduce_in_fp32=False)
    a, b = plan_spec(fp32, system, options), plan_spec(bf16, system, options)
    critical = a.plan.critical_stage().index
    n = stage_parameters(fp32.model, fp32.mapping, critical).dense_total
    assert (a.data_parallel.grad_bytes, b.data_parallel.grad_bytes) == (4 * n, 2 * n)
    assert a.data_parallel.param_gather_bytes == b.data_parallel.param_gather_bytes
    assert b.data_parallel.link_s < a.data_parallel.link_s
    owned = a.optimizer.parameters
    assert owned == b.optimizer.parameters == math.ceil(n / 4)
    # Adam reads the buffer: fp32 4 + 8 + 16 + 2, bf16 2 + 8 + 16 + 2 (the fp32 copy Megatron
    # makes of a 16-bit buffer is not counted: optimizer_step.py)
    assert (a.optimizer.bytes_moved, b.optimizer.bytes_moved) == (30 * owned, 28 * owned)


def test_the_search_reads_the_datatype() -> None:
    """The vectorized figures under ``params`` against ``default``: the same rows, half the DP
    gradient bytes, the gradient memory and the Adam traffic as the plan's formulas give
    (row-by-row equality with the plan: tests/search/test_evaluate_vectorized.py)."""
    from blueprinting.search.evaluate_vectorized import evaluate_candidates
    from blueprinting.search.space import SearchSpace, enumerate_strategies

    model, system = model_preset("llama3-8b"), system_preset("dgx-h100")
    space = SearchSpace(gpu_counts=(16,), global_batch_size=8, max_microbatch_size=1)
    tables = [
        enumerate_strategies(model, dataclasses.replace(space, grad_reduce_dtype=choice)).table
        for choice in (GradReduceDtype.DEFAULT, GradReduceDtype.PARAMS)
    ]
    fp32, bf16 = (evaluate_candidates(table, model, system) for table in tables)
    assert len(tables[0]) == len(tables[1])
    for column in ("tensor", "pipeline", "data", "context", "micro_batch", "recompute"):
        assert np.array_equal(getattr(tables[0], column), getattr(tables[1], column))
    synced = 0
    for i in range(len(tables[0])):
        a, b = fp32.row_json(i), bf16.row_json(i)
        dp_a, dp_b = a["dp_comm"], b["dp_comm"]
        mem_a, mem_b = a["memory_bytes"], b["memory_bytes"]
        assert isinstance(dp_a, dict) and isinstance(dp_b, dict)
        assert isinstance(mem_a, dict) and isinstance(mem_b, dict)
        grads = dp_a["grad_bytes"]
        assert isinstance(grads, int)
        assert dp_b["grad_bytes"] == grads // 2
        # 4 vs 2 bytes per parameter in the gradient buffer
        grad_mem_a, grad_mem_b = mem_a["gradients"], mem_b["gradients"]
        assert isinstance(grad_mem_a, int) and isinstance(grad_mem_b, int)
        assert grad_mem_b * 2 == grad_mem_a
        link_a, link_b = dp_a["link_s"], dp_b["link_s"]
        assert isinstance(link_a, float) and isinstance(link_b, float)
        if link_a > 0:
            synced += 1
            assert link_b < link_a
    # every row with a dp x cp group of more than one rank reduces its gradients
    assert synced == int(((tables[0].data * tables[0].context) > 1).sum()) > 0


def test_the_step_sets_the_peak_when_its_copy_outweighs_what_it_frees() -> None:
    """Llama 3 8B on one GPU with bf16 gradients, full recompute and no optimizer sharding: the
    fp32 gradient copy (4 B x 8.0 billion parameters, 32 GB) is larger than the checkpoints and
    buffers the backward held, so the optimizer step sets the peak. allocated_peak is then the
    persistent state, the copy and the workspace, and still total + transient + workspace."""
    keys = {
        "world_size": 1,
        "tensor_model_parallel_size": 1,
        "micro_batch_size": 1,
        "global_batch_size": 1,
        "use_distributed_optimizer": False,
        "recompute_granularity": "full",
        "recompute_method": "uniform",
        "recompute_num_layers": 1,
        "grad_reduce_in_fp32": False,
    }
    spec = from_mapping(keys, model=model_preset("llama3-8b"))
    (memory,) = memory_per_stage(spec.model, spec.mapping, capacity_bytes=10**12)
    n = stage_parameters(spec.model, spec.mapping, 0).dense_total
    assert memory.optimizer_step_copy == 4 * n
    assert memory.optimizer_states == 12 * n
    assert memory.peak is MemoryPeak.OPTIMIZER_STEP
    assert memory.transient == 4 * n - memory.activations - memory.other
    held = memory.weights + memory.gradients + memory.optimizer_states
    assert memory.allocated_peak == held + 4 * n + memory.workspace


def test_the_plan_text_names_the_steps_copy(capsys: pytest.CaptureFixture[str]) -> None:
    from blueprinting.cli.main import main

    argv = ["plan", "--model", "llama3-8b", "--system", "dgx-h100", "--gpus", "8"]
    sets = ["--set", "global_batch_size=8", "--set", "use_distributed_optimizer=true"]
    assert main([*argv, *sets, "--set", "grad_reduce_in_fp32=false"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "optimizer step: the fp32 copy of the 16-bit gradients," in text
    assert "made at the step and freed before the next forward" in text
    assert main([*argv, *sets]) == 0
    assert "optimizer step:" not in capsys.readouterr().out
