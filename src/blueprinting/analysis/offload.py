"""The time layer-wise CPU offloading adds to an iteration: the copies the compute waits for.

Transformer Engine's offload schedule (``transformer_engine/pytorch/cpu_offload.py`` @d0067d0d,
the context Megatron-Core opens around each layer, ``transformer_block.py`` l.304-325, 742
@d98e8a64), for ``L`` layers of which the first ``N`` offload, one copy stream:

- forward: layer ``i``'s saved tensors start copying to pinned host memory when layer ``i + 1``'s
  forward starts, and the compute stream waits for that copy at layer ``L - N + i``'s forward;
- backward: layer ``i``'s reload starts at layer ``L - 1 - N + i``'s backward and the compute
  waits for it when layer ``i``'s backward reads its tensors.

With each layer's forward taking ``f``, its backward ``g`` and its copy ``x`` (one layer's
stores over the link), the copies queue on the one stream: the last offloaded layer's copy ends
at ``f + N x`` when copying is the slower (``x > f``), and its deadline is ``(L - 1) f``; the
first reload deadline is met in the same way, so the compute waits, per microbatch,

    max(0, N x_d2h - (L - 2) f) + max(0, N x_h2d - (L - 2) g)

(nothing while the stream keeps up, ``x <= f`` and ``N <= L - 2``). The stage's MoE and dense
layers differ: ``N x`` is the offloaded layers' stores over the link, ``(L - 2) f`` the
stage's blocks' forward scaled by ``(L - 2) / L``. Not modelled: the copies' share of HBM
bandwidth against the compute (they run on the copy engines, off the SMs), and two GPUs of a
Grace superchip sharing its memory.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import final

from blueprinting.analysis.memory import offloaded_layers, stage_activations
from blueprinting.errors import UnsupportedError
from blueprinting.hardware.system import SystemSpec
from blueprinting.mapping.transformer import TrainingSpec
from blueprinting.synthesizer.stages.portable_plan.ir import BlockCost, PortablePlanIR, StagePlan


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class OffloadCost:
    """One microbatch's offloading on the stage: the bytes each way, the copies' times and the
    layers' passes they hide under, and what the compute waits."""

    layers: int
    bytes: int
    device_to_host_s: float
    host_to_device_s: float
    forward_window_s: float
    backward_window_s: float

    @property
    def exposed_s(self) -> float:
        return max(0.0, self.device_to_host_s - self.forward_window_s) + max(
            0.0, self.host_to_device_s - self.backward_window_s
        )


def offload_cost(
    spec: TrainingSpec, system: SystemSpec, plan: PortablePlanIR, stage: StagePlan
) -> OffloadCost | None:
    """The stage's :class:`OffloadCost` (module docstring); None without offloading. Raises
    :class:`UnsupportedError` when the system has no measured host link."""
    layers = offloaded_layers(spec.mapping.parallelism.offload)
    if layers == 0:
        return None
    link = system.host_link
    if link is None:
        raise UnsupportedError(
            f"cpu_offloading needs the GPU's link to host memory, which system {system.name!r} "
            "does not give (set system.host_link = {device_to_host_bytes_per_s = ..., "
            "host_to_device_bytes_per_s = ...}: the copy engines' pinned-memory rates per GPU)"
        )
    stored = stage_activations(spec.model, spec.mapping, stage.index).host_offloaded
    forward = _blocks_pass_s(plan, stage, lambda block: block.forward.critical_path_s)
    backward = _blocks_pass_s(
        plan,
        stage,
        lambda block: (
            block.backward_activation.critical_path_s + block.backward_weight.critical_path_s
        ),
    )
    blocks = stage.blocks
    hidden = max(blocks - 2, 0) / blocks if blocks else 0.0
    return OffloadCost(
        layers=layers,
        bytes=stored,
        device_to_host_s=stored / link.device_to_host_bytes_per_s,
        host_to_device_s=stored / link.host_to_device_bytes_per_s,
        forward_window_s=forward * hidden,
        backward_window_s=backward * hidden,
    )


def _blocks_pass_s(
    plan: PortablePlanIR, stage: StagePlan, pass_s: Callable[[BlockCost], float]
) -> float:
    """One pass (``pass_s`` of a costed block) over the stage's dense and MoE blocks, with the
    sliding-window layers' change."""
    moe = 0.0 if plan.moe_block is None else pass_s(plan.moe_block)
    window = 0.0 if plan.window is None else pass_s(plan.window)
    moe_window = 0.0 if plan.moe_window is None else pass_s(plan.moe_window)
    return (
        stage.dense_blocks * pass_s(plan.block)
        + stage.moe_blocks * moe
        + stage.windowed_blocks * window
        + stage.moe_windowed_blocks * moe_window
    )
