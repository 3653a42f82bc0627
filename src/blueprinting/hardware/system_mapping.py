"""Systems to and from plain mappings (a config file's ``[system]`` section, TOML / JSON files).

The mapping form (every key optional when a ``preset`` is given; SI units, the unit in the name)::

    [system]
    preset = "dgx-a100-80gb"          # start from SYSTEM_PRESETS[preset], then apply the rest
    name = "my-a100-cluster"
    gpus_per_node = 8
    nvlink_domain_size = 72           # GPUs on one NVLink fabric (a multiple of gpus_per_node;
                                      # absent: the node), e.g. GB200 NVL72 with 4 GPUs per tray
    nvlink_domain_placement = "segmented"  # how a job's nodes fill the domains: "segmented"
                                      # (default; Megatron-Bridge's sbatch --segment) or "packed"
    processing_mode = "roofline"      # or "no_overlap"
    async_tp_backward_comm = true     # false: Megatron-LM before Sept. 2021 (SystemSpec docs)
    host_cpu = "x86"                  # or "grace": the CPU issuing the kernels (hardware/host.py)
    host_link = {device_to_host_bytes_per_s = 301e9, host_to_device_bytes_per_s = 346e9,
                 source = "..."}      # per GPU and direction (activation offloading)
    rank_layout = "tp-dp-pp"          # or, Calculon-style, fixed link tiers:
    # fixed_tiers = {tp = "intra_node", pp = "scale_out", dp = "scale_out"}

    [system.accelerator]
    name = "A100-SXM4-80GB"
    [system.accelerator.matrix.bfloat16]
    peak_flop_per_s = 312e12
    efficiency = 0.8                  # a number is a ConstantEfficiency
    [system.accelerator.vector.bfloat16]
    peak_flop_per_s = 39e12
    efficiency = {model = "steps", steps = [[16e9, 0.95], [0, 0.5]]}   # thresholds in FLOPs
    [system.accelerator.hbm]
    capacity_bytes = 80e9
    bandwidth_bytes_per_s = 2039e9
    efficiency = 0.9
    # [system.accelerator.offload] has the same keys (Calculon's mem2)
    [system.accelerator.attention]    # measured fused-attention rates (causal, fwd+bwd)
    kernel = "FlashAttention-2"
    source = "my cluster's flash-attention benchmark"
    head_dims = [64, 128]
    seq_lengths = [2048, 8192]
    tflops = [[140, 165], [155, 182]]  # one row per head dim, one value per sequence length

    [system.accelerator.low_precision.mxfp8]   # the TE linears' rate under an FP8 / FP4 recipe
    peak_flop_per_s = 4500e12         # formats: fp8, fp8_blockwise, mxfp8, nvfp4
    efficiency = {model = "saturating_gemm", peak_fraction = 0.63, half_saturation_dim = 128}

    [system.runtime]                  # device memory beside the tensors (RuntimeMemory)
    cuda_context_bytes = 536870912
    nccl_ring_channels = 24           # NCCL's channels (RuntimeMemory.nccl_bytes)
    nccl_p2p_channels_per_peer = 32
    nccl_nvls_channels = 16           # 0: no NVLink SHARP (or NCCL_NVLS_ENABLE=0)
    # or a measured figure per communicator instead (NcclPerCommunicator; the channels unread):
    # nccl_bytes_per_communicator = 688000000, nccl_bytes_per_pair_communicator = 544000000
    workspace_bytes = 67108864

    [system.ep_kernels.hybridep]      # a flex backend's measured dispatch / combine rates in
    source = "my test_hybrid_ep.py"   # one NVLink domain (hardware/ep_kernels.py); or deepep,
    sms = 32                          # ncclep; replaces the preset's table for that backend
    ranks = [8, 32]                   # EP group sizes measured (linear between, clamped)
    dispatch_bytes_per_s = [546e9, 484e9]   # bytes a rank receives / time (algorithm bandwidth)
    combine_bytes_per_s = [569e9, 465e9]

    [system.intra_node]               # and [system.scale_out]
    bandwidth_bytes_per_s = 300e9     # per GPU, per direction
    latency_s = 1e-5
    efficiency = 0.75
    processor_usage = 0.0
    costs = {all_reduce = [2, -1], reduce_scatter = [1, -1], all_gather = [1, -1], p2p = [1]}
    all_to_all_efficiency = 0.71      # optional: NCCL's all-to-all where measured apart from
                                      # the rings (absent: ``efficiency``; on scale_out the
                                      # NIC's share; collectives.link_efficiency)

Efficiency tables: ``{model = "constant", fraction = f}``, ``{model = "steps", steps = [[threshold,
fraction], ...]}``, ``{model = "saturating_gemm", peak_fraction = f, half_saturation_dim = d}``,
``{model = "gemm_shape", peak_fraction = f, half_saturation_dim = d, half_saturation_flops = F}``
(what ``blueprinting calibrate --gemm`` fits).
A cost pair ``[scalar]`` (or ``[scalar, null]`` in JSON) has no ``1/n`` term.

Overrides: the section is deep-merged over ``system_to_mapping(preset)``: nested tables merge
key by key, while an ``efficiency`` (or ``all_to_all_efficiency``) value replaces the preset's
whole efficiency model (a link's ``efficiency`` leaves the preset's ``all_to_all_efficiency`` as
it is: give both to move both), and
giving ``rank_layout`` or ``fixed_tiers`` drops the other. Every problem is reported at once in
one :class:`~blueprinting.errors.ConfigError`; unknown keys get a did-you-mean.

Public API: ``system_from_mapping(section, *, source=None) -> SystemSpec``,
``system_to_mapping(system) -> dict[str, object]`` (JSON-able; round-trips),
``load_system(path) -> SystemSpec`` (``.toml`` or ``.json``; the file is either a system mapping
or has one under a ``system`` key).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import TypeVar, assert_never

from blueprinting.errors import ConfigError, ProblemCollector
from blueprinting.hardware.attention import AttentionKernelRates
from blueprinting.hardware.collectives import (
    DEFAULT_ALL_TO_ALL,
    CollectiveCost,
    CollectiveCosts,
    CollectiveKind,
)
from blueprinting.hardware.efficiency import (
    ConstantEfficiency,
    Efficiency,
    EfficiencyStep,
    GemmShapeEfficiency,
    SaturatingGemmEfficiency,
    SteppedEfficiency,
)
from blueprinting.hardware.ep_kernels import EpKernelRates
from blueprinting.hardware.host import HostCpu
from blueprinting.hardware.system import (
    AcceleratorSpec,
    ByRankLayout,
    ComputeEngineSpec,
    DatatypeRate,
    DomainPlacement,
    FixedTiers,
    GemmFormatRate,
    HostLink,
    LinkSpec,
    LinkTier,
    MemorySpec,
    NcclBuffers,
    NcclByTransport,
    NcclPerCommunicator,
    NodeSpec,
    ProcessingMode,
    RankLayout,
    RuntimeMemory,
    SystemSpec,
)
from blueprinting.mapping.documents import parse_json, parse_toml, read_text
from blueprinting.mapping.model import Datatype
from blueprinting.mapping.precision import GemmFormat
from blueprinting.mapping.transformer import FlexBackend

_E = TypeVar(
    "_E", ProcessingMode, RankLayout, LinkTier, Datatype, GemmFormat, DomainPlacement, HostCpu
)
_T = TypeVar("_T")
_R = TypeVar("_R")

# What _required returns for an absent key: already reported, so readers stay silent.
_MISSING = object()

_TOP_KEYS = (
    "preset",
    "name",
    "gpus_per_node",
    "nvlink_domain_size",
    "nvlink_domain_placement",
    "processing_mode",
    "rank_layout",
    "fixed_tiers",
    "accelerator",
    "intra_node",
    "scale_out",
    "async_tp_backward_comm",
    "host_cpu",
    "host_link",
    "runtime",
    "ep_kernels",
)
_HOST_LINK_KEYS = ("device_to_host_bytes_per_s", "host_to_device_bytes_per_s", "source")
_ACCELERATOR_KEYS = (
    "name",
    "matrix",
    "vector",
    "hbm",
    "offload",
    "attention",
    "sm_count",
    "low_precision",
)
_ATTENTION_KEYS = ("kernel", "source", "head_dims", "seq_lengths", "tflops")
_EP_KERNEL_KEYS = ("source", "sms", "ranks", "dispatch_bytes_per_s", "combine_bytes_per_s")
_EP_BACKENDS = tuple(backend.value for backend in FlexBackend)
_RUNTIME_BYTES_KEYS = ("cuda_context_bytes", "workspace_bytes")
#: RuntimeMemory.nccl's two variants, each with its own keys (one variant per system)
_NCCL_TRANSPORT_KEYS = {
    "nccl_ring_channels": "ring_channels",
    "nccl_p2p_channels_per_peer": "p2p_channels_per_peer",
    "nccl_nvls_channels": "nvls_channels",
}
_NCCL_MEASURED_KEYS = {
    "nccl_bytes_per_communicator": "bytes_per_communicator",
    "nccl_bytes_per_pair_communicator": "bytes_per_pair_communicator",
}
_RUNTIME_KEYS = (*_RUNTIME_BYTES_KEYS, *_NCCL_TRANSPORT_KEYS, *_NCCL_MEASURED_KEYS)
_RATE_KEYS = ("peak_flop_per_s", "efficiency")
_MEMORY_KEYS = ("capacity_bytes", "bandwidth_bytes_per_s", "efficiency")
_LINK_KEYS = (
    "bandwidth_bytes_per_s",
    "latency_s",
    "efficiency",
    "processor_usage",
    "costs",
    "all_to_all_efficiency",
)
_FIXED_TIER_KEYS = ("tp", "pp", "dp")
# Keys whose value is one indivisible choice: an override replaces it instead of merging into it.
_REPLACED_WHOLE = frozenset({"efficiency", "all_to_all_efficiency", "attention", *_EP_BACKENDS})


# --------------------------------------------------------------------------------------------
# To mapping
# --------------------------------------------------------------------------------------------
def efficiency_to_mapping(model: Efficiency) -> float | dict[str, object]:
    match model:
        case ConstantEfficiency(fraction=fraction):
            return fraction
        case SteppedEfficiency(steps=steps):
            return {"model": "steps", "steps": [[s.threshold, s.fraction] for s in steps]}
        case SaturatingGemmEfficiency(
            peak_fraction=peak_fraction, half_saturation_dim=half_saturation_dim
        ):
            return {
                "model": "saturating_gemm",
                "peak_fraction": peak_fraction,
                "half_saturation_dim": half_saturation_dim,
            }
        case GemmShapeEfficiency(
            peak_fraction=peak_fraction,
            half_saturation_dim=half_saturation_dim,
            half_saturation_flops=half_saturation_flops,
        ):
            return {
                "model": "gemm_shape",
                "peak_fraction": peak_fraction,
                "half_saturation_dim": half_saturation_dim,
                "half_saturation_flops": half_saturation_flops,
            }
        case _ as unreachable:
            assert_never(unreachable)


def _nccl_to_mapping(nccl: NcclBuffers) -> dict[str, object]:
    keys: dict[str, str]
    match nccl:
        case NcclByTransport():
            keys = _NCCL_TRANSPORT_KEYS
        case NcclPerCommunicator():
            keys = _NCCL_MEASURED_KEYS
        case _ as unreachable:
            assert_never(unreachable)
    return {key: getattr(nccl, name) for key, name in keys.items()}


def _cost_to_list(cost: CollectiveCost) -> list[float]:
    return [cost.scalar] if cost.offset is None else [cost.scalar, cost.offset]


def _link_to_mapping(link: LinkSpec) -> dict[str, object]:
    out: dict[str, object] = {
        "bandwidth_bytes_per_s": link.bandwidth_bytes_per_s,
        "latency_s": link.latency_s,
        "efficiency": efficiency_to_mapping(link.efficiency),
        "processor_usage": link.processor_usage,
        "costs": {kind.value: _cost_to_list(link.costs.of(kind)) for kind in CollectiveKind},
    }
    if link.all_to_all_efficiency is not None:  # optional: absent means the link's efficiency
        out["all_to_all_efficiency"] = efficiency_to_mapping(link.all_to_all_efficiency)
    return out


def _memory_to_mapping(memory: MemorySpec) -> dict[str, object]:
    return {
        "capacity_bytes": memory.capacity_bytes,
        "bandwidth_bytes_per_s": memory.bandwidth_bytes_per_s,
        "efficiency": efficiency_to_mapping(memory.efficiency),
    }


def _engine_to_mapping(engine: ComputeEngineSpec) -> dict[str, object]:
    return {
        rate.datatype.value: {
            "peak_flop_per_s": rate.peak_flop_per_s,
            "efficiency": efficiency_to_mapping(rate.efficiency),
        }
        for rate in engine.rates
    }


def system_to_mapping(system: SystemSpec) -> dict[str, object]:
    """The full mapping form of ``system`` (JSON-able; ``system_from_mapping`` reads it back)."""
    accelerator: dict[str, object] = {
        "name": system.accelerator.name,
        "matrix": _engine_to_mapping(system.accelerator.matrix),
        "vector": _engine_to_mapping(system.accelerator.vector),
        "hbm": _memory_to_mapping(system.accelerator.hbm),
    }
    if system.accelerator.offload is not None:
        accelerator["offload"] = _memory_to_mapping(system.accelerator.offload)
    if system.accelerator.sm_count is not None:
        accelerator["sm_count"] = system.accelerator.sm_count
    if system.accelerator.low_precision:
        accelerator["low_precision"] = {
            rate.format.value: {
                "peak_flop_per_s": rate.peak_flop_per_s,
                "efficiency": efficiency_to_mapping(rate.efficiency),
            }
            for rate in system.accelerator.low_precision
        }
    rates = system.accelerator.attention
    if rates is not None:
        accelerator["attention"] = {
            "kernel": rates.kernel,
            "source": rates.source,
            "head_dims": list(rates.head_dims),
            "seq_lengths": list(rates.seq_lengths),
            "tflops": [list(row) for row in rates.tflops],
        }
    result: dict[str, object] = {
        "name": system.name,
        "gpus_per_node": system.node.gpus_per_node,
        "processing_mode": system.processing_mode.value,
    }
    if system.node.nvlink_domain_size is not None:
        result["nvlink_domain_size"] = system.node.nvlink_domain_size
    if system.node.domain_placement is not DomainPlacement.SEGMENTED:
        result["nvlink_domain_placement"] = system.node.domain_placement.value
    match system.network_assignment:
        case ByRankLayout(layout=layout):
            result["rank_layout"] = layout.value
        case FixedTiers(tensor=tensor, pipeline=pipeline, data=data):
            result["fixed_tiers"] = {"tp": tensor.value, "pp": pipeline.value, "dp": data.value}
        case _ as unreachable:
            assert_never(unreachable)
    if not system.async_tp_backward_comm:
        result["async_tp_backward_comm"] = False
    if system.host_cpu is not HostCpu.X86:
        result["host_cpu"] = system.host_cpu.value
    if system.host_link is not None:
        result["host_link"] = {
            "device_to_host_bytes_per_s": system.host_link.device_to_host_bytes_per_s,
            "host_to_device_bytes_per_s": system.host_link.host_to_device_bytes_per_s,
            "source": system.host_link.source,
        }
    result["accelerator"] = accelerator
    result["intra_node"] = _link_to_mapping(system.node.link)
    result["scale_out"] = _link_to_mapping(system.scale_out)
    runtime = system.runtime
    result["runtime"] = {
        "cuda_context_bytes": runtime.cuda_context_bytes,
        **_nccl_to_mapping(runtime.nccl),
        "workspace_bytes": runtime.workspace_bytes,
    }
    if system.node.ep_kernels:
        result["ep_kernels"] = {
            table.backend.value: {
                "source": table.source,
                "sms": table.sms,
                "ranks": list(table.ranks),
                "dispatch_bytes_per_s": list(table.dispatch_bytes_per_s),
                "combine_bytes_per_s": list(table.combine_bytes_per_s),
            }
            for table in system.node.ep_kernels
        }
    return result


# --------------------------------------------------------------------------------------------
# From mapping
# --------------------------------------------------------------------------------------------
def _unknown_keys(
    section: Mapping[str, object], allowed: Sequence[str], where: str, out: ProblemCollector
) -> None:
    for key in section:
        if key in allowed:
            continue
        close = difflib.get_close_matches(str(key), allowed, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        out.add(f"{where}: unknown key {key!r}{hint}; known keys: {', '.join(allowed)}")


def _table(value: object, where: str, out: ProblemCollector) -> Mapping[str, object] | None:
    if value is _MISSING:
        return None
    if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
        return value
    out.add(f"{where} must be a table, got {value!r}")
    return None


def _number(value: object, where: str, out: ProblemCollector) -> float | None:
    if value is _MISSING:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        out.add(f"{where} must be a number, got {value!r}")
        return None
    return float(value)


def _integer(value: object, where: str, out: ProblemCollector) -> int | None:
    if value is _MISSING:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        out.add(f"{where} must be an integer, got {value!r}")
        return None
    return value


def _string(value: object, where: str, out: ProblemCollector) -> str | None:
    if value is _MISSING:
        return None
    if not isinstance(value, str):
        out.add(f"{where} must be a string, got {value!r}")
        return None
    return value


def _choice(enum: type[_E], value: object, where: str, out: ProblemCollector) -> _E | None:
    text = _string(value, where, out)
    if text is None:
        return None
    choices = [member.value for member in enum]
    if text in choices:
        return enum(text)
    close = difflib.get_close_matches(text, choices, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    out.add(f"{where}: unknown value {text!r}{hint}; choices: {', '.join(choices)}")
    return None


def _required(section: Mapping[str, object], key: str, where: str, out: ProblemCollector) -> object:
    if key not in section:
        out.add(f"{where}: missing key {key!r}")
        return _MISSING
    return section[key]


def _checked(out: ProblemCollector, where: str, make: Callable[[], _T]) -> _T | None:
    """Run a constructor; its single-value checks become problems of ``where``."""
    try:
        return make()
    except ConfigError as error:
        for problem in error.problems:
            out.add(f"{where}: {problem}")
        return None


def efficiency_from_mapping(value: object, where: str, out: ProblemCollector) -> Efficiency | None:
    """A number, or a table with ``model`` = ``constant`` | ``steps`` | ``saturating_gemm`` |
    ``gemm_shape``."""
    if value is _MISSING:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        fraction = float(value)
        return _checked(out, where, lambda: ConstantEfficiency(fraction=fraction))
    table = _table(value, where, out)
    if table is None:
        return None
    model = _string(_required(table, "model", where, out), f"{where}.model", out)
    match model:
        case None:
            return None
        case "constant":
            _unknown_keys(table, ("model", "fraction"), where, out)
            fraction_or_none = _number(
                _required(table, "fraction", where, out), f"{where}.fraction", out
            )
            if fraction_or_none is None:
                return None
            constant = fraction_or_none
            return _checked(out, where, lambda: ConstantEfficiency(fraction=constant))
        case "steps":
            _unknown_keys(table, ("model", "steps"), where, out)
            raw_steps = _required(table, "steps", where, out)
            if raw_steps is _MISSING:
                return None
            if not isinstance(raw_steps, list | tuple):
                out.add(f"{where}.steps must be a list of [threshold, fraction] pairs")
                return None
            steps: list[EfficiencyStep] = []
            for index, pair in enumerate(raw_steps):
                at = f"{where}.steps[{index}]"
                if not (isinstance(pair, list | tuple) and len(pair) == 2):
                    out.add(f"{at} must be a [threshold, fraction] pair, got {pair!r}")
                    continue
                threshold = _number(pair[0], f"{at}[0]", out)
                step_fraction = _number(pair[1], f"{at}[1]", out)
                if threshold is None or step_fraction is None:
                    continue
                step = _checked(
                    out, at, partial(EfficiencyStep, threshold=threshold, fraction=step_fraction)
                )
                if step is not None:
                    steps.append(step)
            if len(steps) != len(raw_steps):
                return None
            return _checked(out, where, lambda: SteppedEfficiency(steps=tuple(steps)))
        case "saturating_gemm":
            _unknown_keys(table, ("model", "peak_fraction", "half_saturation_dim"), where, out)
            peak = _number(
                _required(table, "peak_fraction", where, out), f"{where}.peak_fraction", out
            )
            half = _number(
                _required(table, "half_saturation_dim", where, out),
                f"{where}.half_saturation_dim",
                out,
            )
            if peak is None or half is None:
                return None
            pk, hf = peak, half
            return _checked(
                out,
                where,
                lambda: SaturatingGemmEfficiency(peak_fraction=pk, half_saturation_dim=hf),
            )
        case "gemm_shape":
            keys = ("peak_fraction", "half_saturation_dim", "half_saturation_flops")
            _unknown_keys(table, ("model", *keys), where, out)
            values = [
                _number(_required(table, key, where, out), f"{where}.{key}", out) for key in keys
            ]
            pk2, hd, hf2 = values
            if pk2 is None or hd is None or hf2 is None:
                return None
            return _checked(
                out,
                where,
                lambda: GemmShapeEfficiency(
                    peak_fraction=pk2, half_saturation_dim=hd, half_saturation_flops=hf2
                ),
            )
        case _:
            choices = ["constant", "steps", "saturating_gemm", "gemm_shape"]
            close = difflib.get_close_matches(model, choices, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            out.add(f"{where}.model: unknown model {model!r}{hint}; choices: {', '.join(choices)}")
            return None


def _rate_tables(
    value: object,
    where: str,
    out: ProblemCollector,
    keys: type[_E],
    build: Callable[[_E, float, Efficiency], _R],
) -> list[_R] | None:
    """``{key: {peak_flop_per_s, efficiency}}`` tables (a compute engine's datatypes, the
    accelerator's low-precision GEMM formats) as ``build(key, peak, efficiency)`` each; None
    when any is wrong (every problem collected)."""
    table = _table(value, where, out)
    if table is None:
        return None
    rates: list[_R] = []
    ok = True
    for key, raw in table.items():
        at = f"{where}.{key}"
        member = _choice(keys, key, at, out)
        rate_table = _table(raw, at, out)
        if member is None or rate_table is None:
            ok = False
            continue
        _unknown_keys(rate_table, _RATE_KEYS, at, out)
        peak = _number(
            _required(rate_table, "peak_flop_per_s", at, out), f"{at}.peak_flop_per_s", out
        )
        efficiency = efficiency_from_mapping(
            _required(rate_table, "efficiency", at, out), f"{at}.efficiency", out
        )
        if peak is None or efficiency is None:
            ok = False
            continue
        rate = _checked(out, at, partial(build, member, peak, efficiency))
        if rate is None:
            ok = False
        else:
            rates.append(rate)
    return rates if ok else None


def _engine_from_mapping(
    value: object, where: str, out: ProblemCollector
) -> ComputeEngineSpec | None:
    rates = _rate_tables(
        value,
        where,
        out,
        Datatype,
        lambda datatype, peak, efficiency: DatatypeRate(
            datatype=datatype, peak_flop_per_s=peak, efficiency=efficiency
        ),
    )
    if rates is None:
        return None
    return _checked(out, where, lambda: ComputeEngineSpec(rates=tuple(rates)))


def _memory_from_mapping(value: object, where: str, out: ProblemCollector) -> MemorySpec | None:
    table = _table(value, where, out)
    if table is None:
        return None
    _unknown_keys(table, _MEMORY_KEYS, where, out)
    capacity = _number(
        _required(table, "capacity_bytes", where, out), f"{where}.capacity_bytes", out
    )
    bandwidth = _number(
        _required(table, "bandwidth_bytes_per_s", where, out),
        f"{where}.bandwidth_bytes_per_s",
        out,
    )
    efficiency = efficiency_from_mapping(
        _required(table, "efficiency", where, out), f"{where}.efficiency", out
    )
    if capacity is None or bandwidth is None or efficiency is None:
        return None
    cap, bw, eff = capacity, bandwidth, efficiency
    return _checked(
        out,
        where,
        lambda: MemorySpec(capacity_bytes=cap, bandwidth_bytes_per_s=bw, efficiency=eff),
    )


def _cost_from_list(value: object, where: str, out: ProblemCollector) -> CollectiveCost | None:
    if value is _MISSING:
        return None
    if not (isinstance(value, list | tuple) and len(value) in (1, 2)):
        out.add(f"{where} must be [scalar] or [scalar, offset], got {value!r}")
        return None
    scalar = _number(value[0], f"{where}[0]", out)
    offset: float | None = None
    if len(value) == 2 and value[1] is not None:
        offset = _number(value[1], f"{where}[1]", out)
        if offset is None:
            return None
    if scalar is None:
        return None
    sc, off = scalar, offset
    return _checked(out, where, lambda: CollectiveCost(scalar=sc, offset=off))


def _link_from_mapping(value: object, where: str, out: ProblemCollector) -> LinkSpec | None:
    table = _table(value, where, out)
    if table is None:
        return None
    _unknown_keys(table, _LINK_KEYS, where, out)
    bandwidth = _number(
        _required(table, "bandwidth_bytes_per_s", where, out),
        f"{where}.bandwidth_bytes_per_s",
        out,
    )
    latency = _number(_required(table, "latency_s", where, out), f"{where}.latency_s", out)
    efficiency = efficiency_from_mapping(
        _required(table, "efficiency", where, out), f"{where}.efficiency", out
    )
    usage = _number(table.get("processor_usage", 0.0), f"{where}.processor_usage", out)
    all_to_all: Efficiency | None = None
    given_all_to_all = "all_to_all_efficiency" in table
    if given_all_to_all:
        all_to_all = efficiency_from_mapping(
            table["all_to_all_efficiency"], f"{where}.all_to_all_efficiency", out
        )
    costs_table = _table(_required(table, "costs", where, out), f"{where}.costs", out)
    costs: dict[CollectiveKind, CollectiveCost] = {}
    if costs_table is not None:
        _unknown_keys(costs_table, [kind.value for kind in CollectiveKind], f"{where}.costs", out)
        for kind in CollectiveKind:
            at = f"{where}.costs.{kind.value}"
            if kind is CollectiveKind.ALL_TO_ALL and kind.value not in costs_table:
                costs[kind] = DEFAULT_ALL_TO_ALL  # optional: files written before it existed
                continue
            cost = _cost_from_list(
                _required(costs_table, kind.value, f"{where}.costs", out), at, out
            )
            if cost is not None:
                costs[kind] = cost
    if (
        bandwidth is None
        or latency is None
        or efficiency is None
        or usage is None
        or len(costs) != len(CollectiveKind)
        or (given_all_to_all and all_to_all is None)  # its problem is recorded with the rest
    ):
        return None
    bw, lat, eff, use, a2a = bandwidth, latency, efficiency, usage, all_to_all
    collective_costs = CollectiveCosts(
        all_reduce=costs[CollectiveKind.ALL_REDUCE],
        reduce_scatter=costs[CollectiveKind.REDUCE_SCATTER],
        all_gather=costs[CollectiveKind.ALL_GATHER],
        p2p=costs[CollectiveKind.P2P],
        all_to_all=costs[CollectiveKind.ALL_TO_ALL],
    )
    return _checked(
        out,
        where,
        lambda: LinkSpec(
            bandwidth_bytes_per_s=bw,
            latency_s=lat,
            efficiency=eff,
            costs=collective_costs,
            processor_usage=use,
            all_to_all_efficiency=a2a,
        ),
    )


def _low_precision_from_mapping(
    value: object, where: str, out: ProblemCollector
) -> tuple[GemmFormatRate, ...] | None:
    """``[system.accelerator.low_precision.<format>]`` tables (``fp8``, ``fp8_blockwise``,
    ``mxfp8``, ``nvfp4``), each with ``peak_flop_per_s`` and ``efficiency``."""
    rates = _rate_tables(
        value,
        where,
        out,
        GemmFormat,
        lambda fmt, peak, efficiency: GemmFormatRate(
            format=fmt, peak_flop_per_s=peak, efficiency=efficiency
        ),
    )
    return None if rates is None else tuple(rates)


def _accelerator_from_mapping(
    value: object, where: str, out: ProblemCollector
) -> AcceleratorSpec | None:
    table = _table(value, where, out)
    if table is None:
        return None
    _unknown_keys(table, _ACCELERATOR_KEYS, where, out)
    name = _string(_required(table, "name", where, out), f"{where}.name", out)
    matrix = _engine_from_mapping(_required(table, "matrix", where, out), f"{where}.matrix", out)
    vector = _engine_from_mapping(_required(table, "vector", where, out), f"{where}.vector", out)
    hbm = _memory_from_mapping(_required(table, "hbm", where, out), f"{where}.hbm", out)
    offload = (
        _memory_from_mapping(table["offload"], f"{where}.offload", out)
        if "offload" in table
        else None
    )
    attention = (
        _attention_from_mapping(table["attention"], f"{where}.attention", out)
        if "attention" in table
        else None
    )
    sm_count = (
        _integer(table["sm_count"], f"{where}.sm_count", out) if "sm_count" in table else None
    )
    low_precision = (
        _low_precision_from_mapping(table["low_precision"], f"{where}.low_precision", out)
        if "low_precision" in table
        else ()
    )
    if low_precision is None:
        return None
    if name is None or matrix is None or vector is None or hbm is None:
        return None
    if ("offload" in table and offload is None) or ("attention" in table and attention is None):
        return None
    if sm_count is not None and sm_count < 1:
        out.add(f"{where}.sm_count must be a positive integer, got {sm_count}")
        return None
    if "sm_count" in table and sm_count is None:
        return None
    return AcceleratorSpec(
        name=name,
        matrix=matrix,
        vector=vector,
        hbm=hbm,
        offload=offload,
        attention=attention,
        sm_count=sm_count,
        low_precision=low_precision,
    )


def _int_list(value: object, where: str, out: ProblemCollector) -> tuple[int, ...] | None:
    if value is _MISSING:
        return None  # already reported
    if not isinstance(value, list) or not value:
        out.add(f"{where} must be a non-empty list of integers, got {value!r}")
        return None
    items = [_integer(item, f"{where}[{i}]", out) for i, item in enumerate(value)]
    return None if any(item is None for item in items) else tuple(int(i or 0) for i in items)


def _attention_from_mapping(
    value: object, where: str, out: ProblemCollector
) -> AttentionKernelRates | None:
    table = _table(value, where, out)
    if table is None:
        return None
    _unknown_keys(table, _ATTENTION_KEYS, where, out)
    kernel = _string(_required(table, "kernel", where, out), f"{where}.kernel", out)
    source = _string(table.get("source", "user-supplied"), f"{where}.source", out)
    dims = _int_list(_required(table, "head_dims", where, out), f"{where}.head_dims", out)
    seqs = _int_list(_required(table, "seq_lengths", where, out), f"{where}.seq_lengths", out)
    raw = _required(table, "tflops", where, out)
    rows: list[tuple[float, ...]] = []
    if not isinstance(raw, list):
        if raw is not _MISSING:
            out.add(f"{where}.tflops must be a list of rows of numbers, got {raw!r}")
        return None
    for i, row in enumerate(raw):
        if not isinstance(row, list):
            out.add(f"{where}.tflops[{i}] must be a list of numbers, got {row!r}")
            return None
        numbers = [_number(x, f"{where}.tflops[{i}][{j}]", out) for j, x in enumerate(row)]
        if any(x is None for x in numbers):
            return None
        rows.append(tuple(float(x or 0.0) for x in numbers))
    if kernel is None or source is None or dims is None or seqs is None:
        return None
    return _checked(
        out,
        where,
        lambda: AttentionKernelRates(
            kernel=kernel, source=source, head_dims=dims, seq_lengths=seqs, tflops=tuple(rows)
        ),
    )


def _number_list(value: object, where: str, out: ProblemCollector) -> tuple[float, ...] | None:
    if value is _MISSING:
        return None  # already reported
    if not isinstance(value, list) or not value:
        out.add(f"{where} must be a non-empty list of numbers, got {value!r}")
        return None
    items = [_number(item, f"{where}[{i}]", out) for i, item in enumerate(value)]
    return None if any(item is None for item in items) else tuple(float(x or 0.0) for x in items)


def _ep_kernels_from_mapping(
    value: object, where: str, out: ProblemCollector
) -> tuple[EpKernelRates, ...] | None:
    """``[system.ep_kernels.<backend>]``: a flex backend's measured dispatch / combine rates
    (:class:`~blueprinting.hardware.ep_kernels.EpKernelRates`), one table per backend."""
    table = _table(value, where, out)
    if table is None:
        return None
    _unknown_keys(table, _EP_BACKENDS, where, out)
    found: list[EpKernelRates] = []
    bad = False
    # in the table's order: system_to_mapping writes the node's, so a system reads back equal
    for backend in (FlexBackend(key) for key in table if key in _EP_BACKENDS):
        here = f"{where}.{backend.value}"
        entry = _table(table[backend.value], here, out)
        if entry is None:
            bad = True
            continue
        _unknown_keys(entry, _EP_KERNEL_KEYS, here, out)
        source = _string(entry.get("source", "user-supplied"), f"{here}.source", out)
        sms = _integer(_required(entry, "sms", here, out), f"{here}.sms", out)
        ranks = _int_list(_required(entry, "ranks", here, out), f"{here}.ranks", out)
        dispatch = _number_list(
            _required(entry, "dispatch_bytes_per_s", here, out),
            f"{here}.dispatch_bytes_per_s",
            out,
        )
        combine = _number_list(
            _required(entry, "combine_bytes_per_s", here, out),
            f"{here}.combine_bytes_per_s",
            out,
        )
        if source is None or sms is None or ranks is None or dispatch is None or combine is None:
            bad = True
            continue
        rates = _checked(
            out,
            here,
            partial(
                EpKernelRates,
                backend=backend,
                source=source,
                sms=sms,
                ranks=ranks,
                dispatch_bytes_per_s=dispatch,
                combine_bytes_per_s=combine,
            ),
        )
        if rates is None:
            bad = True
        else:
            found.append(rates)
    return None if bad else tuple(found)


def _runtime_from_mapping(value: object, where: str, out: ProblemCollector) -> RuntimeMemory | None:
    """``[system.runtime]``: the byte keys, and NCCL's buffers counted by transport (the channel
    keys; each absent one at :class:`NcclByTransport`'s default) or, where the table gives
    ``nccl_bytes_per_communicator`` or ``nccl_bytes_per_pair_communicator``, that measured
    figure per communicator (:class:`NcclPerCommunicator`; the other at NVIDIA/nccl #964's).
    A table naming keys of both is refused (a preset's keys of the other variant are dropped
    before, by :func:`_with_preset`)."""
    table = _table(value, where, out)
    if table is None:
        return None
    _unknown_keys(table, _RUNTIME_KEYS, where, out)
    values: dict[str, int] = {}
    bad = False
    for key in _RUNTIME_KEYS:
        if key not in table:
            continue
        raw = table[key]
        if isinstance(raw, float) and raw.is_integer():
            raw = int(raw)  # TOML/JSON exponent notation (64e6) reads as a float
        # a ring or a send / receive pair needs a channel; NVLS may be off (0)
        least = 1 if key in ("nccl_ring_channels", "nccl_p2p_channels_per_peer") else 0
        if type(raw) is not int or raw < least:
            unit = "" if key in _NCCL_TRANSPORT_KEYS else " (bytes)"
            kind = "a positive" if least else "a non-negative"
            out.add(f"{where}.{key} must be {kind} integer{unit}, got {raw!r}")
            bad = True
            continue
        values[key] = raw
    if bad:
        return None
    transport = [key for key in _NCCL_TRANSPORT_KEYS if key in table]
    measured = [key for key in _NCCL_MEASURED_KEYS if key in table]
    if transport and measured:
        out.add(
            f"{where}: NCCL's buffers are counted either by transport ({', '.join(transport)}) "
            f"or as a measured figure per communicator ({', '.join(measured)}), not both"
        )
        return None
    nccl: NcclBuffers
    if measured:
        nccl = NcclPerCommunicator(
            **{name: values[key] for key, name in _NCCL_MEASURED_KEYS.items() if key in values}
        )
    else:
        nccl = NcclByTransport(
            **{name: values[key] for key, name in _NCCL_TRANSPORT_KEYS.items() if key in values}
        )
    defaults = RuntimeMemory()
    return RuntimeMemory(
        cuda_context_bytes=values.get("cuda_context_bytes", defaults.cuda_context_bytes),
        nccl=nccl,
        workspace_bytes=values.get("workspace_bytes", defaults.workspace_bytes),
    )


def _merge(base: Mapping[str, object], override: Mapping[str, object]) -> dict[str, object]:
    merged: dict[str, object] = dict(base)
    for key, value in override.items():
        old = merged.get(key)
        if key not in _REPLACED_WHOLE and isinstance(old, Mapping) and isinstance(value, Mapping):
            merged[key] = _merge(old, value)
        else:
            merged[key] = value
    return merged


def _with_preset(section: Mapping[str, object], out: ProblemCollector) -> Mapping[str, object]:
    if "preset" not in section:
        return section
    name = _string(section["preset"], "system.preset", out)
    if name is None:
        return {key: value for key, value in section.items() if key != "preset"}
    # Imported here: presets are built with this module's types, not the other way round.
    from blueprinting.hardware.presets import system_preset

    try:
        base = system_to_mapping(system_preset(name))
    except ConfigError as error:
        for problem in error.problems:
            out.add(problem)
        return {key: value for key, value in section.items() if key != "preset"}
    overrides = {key: value for key, value in section.items() if key != "preset"}
    # The two network-assignment forms exclude each other: the user's choice wins.
    if "fixed_tiers" in overrides:
        base.pop("rank_layout", None)
    if "rank_layout" in overrides:
        base.pop("fixed_tiers", None)
    # So do RuntimeMemory.nccl's two variants: keys of one in the override drop the preset's
    # keys of the other (a measurement of one's own replaces the preset's channel count).
    runtime = overrides.get("runtime")
    preset_runtime = base.get("runtime")
    if isinstance(runtime, Mapping) and isinstance(preset_runtime, dict):
        for mine, other in (
            (_NCCL_MEASURED_KEYS, _NCCL_TRANSPORT_KEYS),
            (_NCCL_TRANSPORT_KEYS, _NCCL_MEASURED_KEYS),
        ):
            if any(key in runtime for key in mine):
                base["runtime"] = {k: v for k, v in preset_runtime.items() if k not in other}
    return _merge(base, overrides)


def system_from_mapping(section: Mapping[str, object], *, source: str | None = None) -> SystemSpec:
    """Build a :class:`SystemSpec` from a ``[system]`` section (``preset`` plus overrides, or a
    full mapping as :func:`system_to_mapping` writes it). Raises one ``ConfigError`` listing
    every problem."""
    out = ProblemCollector(source=source)
    _unknown_keys(section, _TOP_KEYS, "system", out)
    known = len(out.problems)
    merged = _with_preset(section, out)
    if len(out.problems) > known:
        # An unknown preset leaves nothing to merge over: the keys it would have supplied are
        # not the user's mistake, so report the problems so far and stop.
        out.raise_if_any()
    name = _string(_required(merged, "name", "system", out), "system.name", out)
    gpus_per_node = _integer(
        _required(merged, "gpus_per_node", "system", out), "system.gpus_per_node", out
    )
    domain = (
        _integer(merged["nvlink_domain_size"], "system.nvlink_domain_size", out)
        if "nvlink_domain_size" in merged
        else None
    )
    placement = _choice(
        DomainPlacement,
        merged.get("nvlink_domain_placement", DomainPlacement.SEGMENTED.value),
        "system.nvlink_domain_placement",
        out,
    )
    mode = _choice(
        ProcessingMode,
        merged.get("processing_mode", ProcessingMode.ROOFLINE.value),
        "system.processing_mode",
        out,
    )
    async_tp = merged.get("async_tp_backward_comm", True)
    if not isinstance(async_tp, bool):
        out.add(f"system.async_tp_backward_comm must be true or false, got {async_tp!r}")
    host_cpu = _choice(HostCpu, merged.get("host_cpu", HostCpu.X86.value), "system.host_cpu", out)
    host_link = (
        _host_link_from_mapping(merged["host_link"], "system.host_link", out)
        if "host_link" in merged
        else None
    )
    assignment = _assignment_from_mapping(merged, out)
    accelerator = _accelerator_from_mapping(
        _required(merged, "accelerator", "system", out), "system.accelerator", out
    )
    intra = _link_from_mapping(
        _required(merged, "intra_node", "system", out), "system.intra_node", out
    )
    scale_out = _link_from_mapping(
        _required(merged, "scale_out", "system", out), "system.scale_out", out
    )
    runtime = (
        _runtime_from_mapping(merged["runtime"], "system.runtime", out)
        if "runtime" in merged
        else RuntimeMemory()
    )
    ep_kernels = (
        _ep_kernels_from_mapping(merged["ep_kernels"], "system.ep_kernels", out)
        if "ep_kernels" in merged
        else ()
    )
    node = (
        None
        if gpus_per_node is None
        or intra is None
        or ("nvlink_domain_size" in merged and domain is None)
        or placement is None
        or ep_kernels is None
        else _checked(
            out,
            "system",
            lambda: NodeSpec(
                gpus_per_node=gpus_per_node,
                link=intra,
                nvlink_domain_size=domain,
                domain_placement=placement,
                ep_kernels=ep_kernels,
            ),
        )
    )
    out.raise_if_any()
    if (
        name is None
        or mode is None
        or assignment is None
        or accelerator is None
        or node is None
        or scale_out is None
        or runtime is None
        or host_cpu is None
    ):
        raise ConfigError(["system: incomplete"], source=source)  # pragma: no cover
    return SystemSpec(
        name=name,
        accelerator=accelerator,
        node=node,
        scale_out=scale_out,
        processing_mode=mode,
        network_assignment=assignment,
        async_tp_backward_comm=async_tp is not False,
        host_cpu=host_cpu,
        runtime=runtime,
        host_link=host_link,
    )


def _host_link_from_mapping(value: object, where: str, out: ProblemCollector) -> HostLink | None:
    """``host_link``: both rates (bytes/s, per GPU and direction) and an optional source."""
    table = _table(value, where, out)
    if table is None:
        return None
    _unknown_keys(table, _HOST_LINK_KEYS, where, out)
    rates = [
        _number(_required(table, key, where, out), f"{where}.{key}", out)
        for key in _HOST_LINK_KEYS[:2]
    ]
    source = _string(table.get("source", ""), f"{where}.source", out)
    d2h, h2d = rates
    if d2h is None or h2d is None or source is None:
        return None
    return _checked(
        out,
        where,
        lambda: HostLink(
            device_to_host_bytes_per_s=d2h, host_to_device_bytes_per_s=h2d, source=source
        ),
    )


def _assignment_from_mapping(
    merged: Mapping[str, object], out: ProblemCollector
) -> ByRankLayout | FixedTiers | None:
    if "rank_layout" in merged and "fixed_tiers" in merged:
        out.add("system: give either rank_layout or fixed_tiers, not both")
        return None
    if "fixed_tiers" not in merged:
        layout = _choice(
            RankLayout,
            merged.get("rank_layout", RankLayout.TP_DP_PP.value),
            "system.rank_layout",
            out,
        )
        return None if layout is None else ByRankLayout(layout=layout)
    table = _table(merged["fixed_tiers"], "system.fixed_tiers", out)
    if table is None:
        return None
    _unknown_keys(table, _FIXED_TIER_KEYS, "system.fixed_tiers", out)
    tiers = [
        _choice(
            LinkTier,
            _required(table, key, "system.fixed_tiers", out),
            f"system.fixed_tiers.{key}",
            out,
        )
        for key in _FIXED_TIER_KEYS
    ]
    tp, pp, dp = tiers
    if tp is None or pp is None or dp is None:
        return None
    return FixedTiers(tensor=tp, pipeline=pp, data=dp)


def system_table(path: str | Path) -> dict[str, object]:
    """The system mapping of a ``.toml`` or ``.json`` file: the whole file, or its ``system``
    table (what ``blueprinting calibrate --out`` writes)."""
    file = Path(path)
    source = str(file)
    document: object
    match file.suffix.lower():
        case ".toml":
            document = parse_toml(read_text(file, what="system file"), source)
        case ".json":
            document = parse_json(read_text(file, what="system file"), source)
        case other:
            raise ConfigError(
                [f"system file must end in .toml or .json, got {other!r}"], source=source
            )
    out = ProblemCollector(source=source)
    table = _table(document, "system file", out)
    out.raise_if_any()
    if table is None:  # pragma: no cover - _table reported it
        raise ConfigError(["system file must be a table"], source=source)
    if "system" in table:
        inner = _table(table["system"], "system", out)
        out.raise_if_any()
        if inner is not None:
            table = inner
    return dict(table)


def is_system_file(name: str) -> bool:
    """``--system`` names a file (``.toml`` / ``.json``) rather than a preset."""
    return Path(name).suffix.lower() in (".toml", ".json")


def system_section_for(name: str) -> dict[str, object]:
    """The ``[system]`` section ``--system NAME`` stands for: a preset name, or a system file's
    table (read here, so its overrides merge with ``--set system.*`` like a config file's)."""
    if is_system_file(name):
        return system_table(name)
    return {"preset": name}


def load_system(path: str | Path) -> SystemSpec:
    """Read a system from a ``.toml`` or ``.json`` file: the whole file, or its ``system`` table."""
    return system_from_mapping(system_table(path), source=str(path))
