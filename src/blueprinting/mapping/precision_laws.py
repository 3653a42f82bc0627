"""The laws of a training precision recipe (``shared/reference/modern_parallelism.md`` 3.4).

Reported with every other law by :func:`blueprinting.mapping.laws.check_training`:

- ``precision_recipe_accelerator`` (Megatron / Transformer Engine): the recipe's GEMM format is
  one the accelerator runs: MXFP8 and NVFP4 need Blackwell (SM 10.0 / 10.3), FP8 needs SM 8.9+
  (TE recipe table, modern_parallelism 3.1); checked where the system is known (``plan``,
  ``check`` with a ``[system]`` section, ``search``);
- ``low_precision_param_gather_needs_sharded_optimizer`` (Megatron): ``--fp8-param-gather`` needs
  the distributed optimizer, torch-FSDP2 or Megatron-FSDP (``arguments.py`` l.1051-1057).
- ``fp8_delayed_scaling_recompute`` (Megatron): delayed FP8 scaling refuses the ``moe_act`` and
  ``layernorm`` recompute modules (``transformer_config.py`` l.1940-2025; shared reference
  section 2.8). The TE >= 2.6 condition beside it is a version, not modelled.
- ``tp_comm_overlap_quantizer`` (Transformer Engine): ``--tp-comm-overlap``'s userbuffers gather
  per-tensor FP8 and MXFP8 tensors only; blockwise FP8 and NVFP4 raise at the first
  all-gather (:func:`~blueprinting.mapping.precision.userbuffers_carry`).

A model whose datatype is float8 (reachable only through the Python API, e.g. the Calculon
oracle's translation) keeps Calculon's convention, every op at the fp8 rate; ``from_mapping``
always gives training a 16-bit (or fp32) base and the FP8 part as the recipe.

The other rules of section 3.4 are enforced by ``from_mapping`` (FP8 with FP4; a recipe or a
param gather without its format; the first / last bf16 layers without a recipe) or concern
options not modelled (``fp8_output_proj``, custom recipes, optimizer CPU offload, TE versions).
"""

from __future__ import annotations

from typing import assert_never

from blueprinting.errors import LawViolation
from blueprinting.mapping.law_names import Law, law_violation
from blueprinting.mapping.model import TransformerModelSpec
from blueprinting.mapping.precision import (
    AcceleratorSupport,
    Fp4Precision,
    Fp8Precision,
    Fp8Recipe,
    HighPrecision,
    TrainingPrecision,
    gemm_format,
    high_precision_layers,
    recipe_name,
    userbuffers_carry,
)
from blueprinting.mapping.transformer import (
    NoOptimizerSharding,
    NoTpCommOverlap,
    RecomputeModule,
    SelectiveRecompute,
    TransformerTrainingMappingSpec,
    UserbufferOverlap,
)


def _param_gather_key(precision: TrainingPrecision) -> str | None:
    """The key of the recipe's low-precision parameter gather when it is on."""
    match precision:
        case HighPrecision():
            return None
        case Fp8Precision(param_gather=gather):
            return "fp8_param_gather" if gather else None
        case Fp4Precision(param_gather=gather):
            return "fp4_param_gather" if gather else None
        case _ as unreachable:
            assert_never(unreachable)


def accelerator_violation(
    precision: TrainingPrecision, accelerator: AcceleratorSupport | None
) -> LawViolation | None:
    """``precision_recipe_accelerator``: the recipe's GEMM format is one the accelerator runs
    (the search checks it once per recipe it is asked to cross, the planner per strategy)."""
    needed = gemm_format(precision)
    if accelerator is None or needed is None or needed in accelerator.formats:
        return None
    has = ", ".join(sorted(f.value for f in accelerator.formats)) or "none"
    return law_violation(
        Law.MEGATRON_PRECISION_RECIPE_ACCELERATOR,
        f"{recipe_name(precision)} needs {needed.value} GEMMs, which accelerator "
        f"{accelerator.name} does not run (its low-precision GEMM formats: {has}; MXFP8 "
        "and NVFP4 need Blackwell SM 10.0/10.3, FP8 SM 8.9+)",
        recipe=recipe_name(precision),
        gemm_format=needed.value,
        accelerator=accelerator.name,
    )


def precision_laws(
    model: TransformerModelSpec,
    mapping: TransformerTrainingMappingSpec,
    accelerator: AcceleratorSupport | None,
    *,
    megatron: bool = True,
) -> list[LawViolation]:
    """Every violated precision law (module docstring); ``accelerator`` None: the system is not
    known and the accelerator law is not checked."""
    out: list[LawViolation] = []
    start, end = high_precision_layers(mapping.precision)
    if start + end > model.num_layers:
        out.append(
            LawViolation(
                law="base_precision_layers",
                formula=Law.BASE_PRECISION_LAYERS.formula,
                values=(("start", start), ("end", end), ("num_layers", model.num_layers)),
                message=(
                    f"num_layers_at_start_in_bf16 + num_layers_at_end_in_bf16 = {start} + {end} "
                    f"exceeds the model's {model.num_layers} layers"
                ),
            )
        )
    if not megatron:
        return out
    precision = mapping.precision
    unsupported = accelerator_violation(precision, accelerator)
    if unsupported is not None:
        out.append(unsupported)
    gather_key = _param_gather_key(precision)
    sharding = mapping.parallelism.data.optimizer_sharding
    if gather_key is not None and isinstance(sharding, NoOptimizerSharding):
        out.append(
            law_violation(
                Law.MEGATRON_PARAM_GATHER_NEEDS_SHARDING,
                f"{gather_key} = true needs use_distributed_optimizer (or Megatron-FSDP): "
                "Megatron-LM asserts it at start-up (arguments.py l.1051-1057)",
                key=gather_key,
                use_distributed_optimizer=False,
            )
        )
    match mapping.tp_comm_overlap:
        case UserbufferOverlap() if not userbuffers_carry(precision):
            out.append(
                law_violation(
                    Law.MEGATRON_TP_COMM_OVERLAP_QUANTIZER,
                    f"tp_comm_overlap = true cannot carry {recipe_name(precision)} tensors: "
                    "Transformer Engine's userbuffers gather per-tensor FP8 and MXFP8 only and "
                    "raise 'Unsupported quantizer for Userbuffers' for the others (TE "
                    "pytorch/module/base.py fill_userbuffers_buffer_for_all_gather)",
                    recipe=recipe_name(precision),
                    tp_comm_overlap=True,
                )
            )
        case UserbufferOverlap() | NoTpCommOverlap():
            pass
        case _ as unreachable:
            assert_never(unreachable)
    recompute = mapping.parallelism.recompute
    if (
        isinstance(precision, Fp8Precision)
        and precision.recipe is Fp8Recipe.DELAYED
        and isinstance(recompute, SelectiveRecompute)
    ):
        refused = sorted(
            m.value
            for m in recompute.modules & {RecomputeModule.MOE_ACT, RecomputeModule.LAYERNORM}
        )
        if refused:
            out.append(
                law_violation(
                    Law.MEGATRON_FP8_DELAYED_RECOMPUTE,
                    f"fp8_recipe = delayed refuses recompute module(s) {', '.join(refused)}: "
                    "'Delayed scaling does not support moe_act and layernorm recompute for "
                    "fp8' (Megatron-LM transformer_config.py l.1940-2025)",
                    modules=" ".join(refused),
                )
            )
    return out
