"""Time of the Adam optimizer step on one GPU.

Adam (Kingma & Ba 2015, Algorithm 1) with mixed precision (Micikevicius et al. 2018) updates each
fp32 main parameter from its gradient and two fp32 moments, then writes the low-precision copy.
Per parameter this is 11 FLOPs (Calculon's count, calculon/llm/layers.py ``Linear`` optimizer
FLOPs) and the HBM traffic

    read grad (grad_bytes) + read/write main param (4 + 4) + read/write m and v (8 + 8)
    + write the model-precision param (param_bytes)

``grad_bytes`` is the gradient buffer's datatype (2 or 4 bytes, ``grad_reduce_dtype``). Not
counted (a known under-count): with a 16-bit buffer (fp16 training, or bf16 with
``grad_reduce_dtype = params``) the optimizer first makes the fp32 main-gradient copy and Adam
reads that: ``main_param.grad = main_grad.float()`` reads the buffer and writes 4 bytes, Adam
reads 4 (NVIDIA/Megatron-LM ``megatron/core/optimizer/optimizer.py``
``_copy_model_grads_to_main_grads`` l.1092-1100, ``distrib_optimizer.py`` l.2756-2792
@d98e8a64; a view, no copy, on an fp32 buffer): 2 + 4 + 4 bytes where this counts 2, and fp16's
loss unscaling of the main gradients. Counting the copy moves every fp16 prediction (the
published Narayanan / Korthikanti rows, Calculon's fp16 oracle records past its gate), so it is
left as the seed counted it.

The step is memory-bound on every accelerator we model; its time is the system's op time of that
traffic and those FLOPs on the vector engine. The GPU updates only the parameters whose optimizer
state it owns: stage_parameters / d under any sharded variant.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, final

from blueprinting.hardware.polymorphic import Count, where
from blueprinting.hardware.system import Engine, SystemSpec
from blueprinting.mapping.model import Datatype

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt


def owned_parameters(
    parameters: Count, *, degree: Count | int, sharded: bool | npt.NDArray[np.bool_]
) -> Count:
    """Parameters whose optimizer state one GPU updates, of a stage's ``parameters``: all of
    them without a sharded optimizer, ``ceil(parameters / degree)`` under any sharded variant
    (the distributed optimizer shards dense parameters over d x cp, Megatron's
    ``intra_dp_cp_group``, and routed experts over expert-dp). One rank's count (the plan) or
    int64 columns of them (the search)."""
    return where(sharded, -(-parameters // degree), parameters)


ADAM_FLOPS_PER_PARAMETER = 11
MAIN_PARAM_BYTES = 4
MOMENT_BYTES = 4


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class OptimizerStepCost:
    parameters: int
    flops: int
    bytes_moved: int
    time_s: float


def adam_step_cost(
    *,
    parameters: int,
    param_bytes: int,
    grad_bytes: int,
    datatype: Datatype,
    system: SystemSpec,
) -> OptimizerStepCost:
    """Adam step over ``parameters`` locally owned parameters (module docstring)."""
    per_param = grad_bytes + 2 * MAIN_PARAM_BYTES + 4 * MOMENT_BYTES + param_bytes
    flops = ADAM_FLOPS_PER_PARAMETER * parameters
    moved = per_param * parameters
    time_s = system.op_time(flops, moved, Engine.VECTOR, datatype)
    return OptimizerStepCost(parameters=parameters, flops=flops, bytes_moved=moved, time_s=time_s)
