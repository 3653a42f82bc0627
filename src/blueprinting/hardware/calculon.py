"""Build a :class:`SystemSpec` from a Calculon system JSON (calculon-ai/calculon ``systems/``).

The mapping follows Calculon at caa4b11 (the oracle's version):

* ``matrix`` / ``vector``: ``{datatype: {tflops, gflops_efficiency: [[GFLOP, eff], ...]}}`` ->
  :class:`DatatypeRate` with peak ``tflops * 1e12`` and a :class:`SteppedEfficiency` whose
  thresholds are ``GFLOP * 1e9`` FLOPs (``calculon/processor.py``);
* ``mem1`` / ``mem2``: ``{GiB, GBps, MB_efficiency}`` -> :class:`MemorySpec` with capacity
  ``GiB * 1024**3``, bandwidth ``GBps * 1e9`` and thresholds ``MB * 1e6`` bytes
  (``calculon/memory.py``); ``mem2`` is the offload tier (absent when its capacity is 0);
* ``networks``: two tiers (every oracle system has two: NVLink of size 8, then InfiniBand) ->
  tier 0 is the node link, its ``size`` the GPUs per node; tier 1 the scale-out link. Each tier's
  ``bandwidth`` (GB/s per direction per processor), ``efficiency`` (constant), ``latency``,
  ``processor_usage`` and ``ops`` ((scalar, offset) per collective; ``offset`` null for p2p)
  carry over unchanged (``calculon/network.py``). ``must_be_filled`` and the tiers' sizes are
  legality checks of the execution (``Llm._check_network_assignments``), not costs: they are
  not modelled here;
* ``processing_mode`` -> :class:`ProcessingMode`;
* ``tensor_par_net``, ``pipeline_par_net``, ``data_par_net`` (execution fields) ->
  :class:`FixedTiers`.

Public API: ``system_from_calculon(sys_json, *, tensor_par_net, pipeline_par_net, data_par_net,
name="calculon") -> SystemSpec``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from blueprinting.errors import ConfigError, UnsupportedError
from blueprinting.hardware.collectives import CollectiveCost, CollectiveCosts
from blueprinting.hardware.efficiency import ConstantEfficiency, EfficiencyStep, SteppedEfficiency
from blueprinting.hardware.system import (
    AcceleratorSpec,
    ComputeEngineSpec,
    DatatypeRate,
    FixedTiers,
    LinkSpec,
    LinkTier,
    MemorySpec,
    NodeSpec,
    ProcessingMode,
    SystemSpec,
)
from blueprinting.mapping.model import Datatype

GIGA = 1e9
MEGA = 1e6
TERA = 1e12
GIBI = 1024**3


def _table(value: object, where: str) -> Mapping[str, object]:
    if isinstance(value, Mapping):
        return value
    raise ConfigError([f"Calculon system: {where} must be an object, got {value!r}"])


def _list(value: object, where: str) -> Sequence[object]:
    if isinstance(value, list | tuple):
        return value
    raise ConfigError([f"Calculon system: {where} must be a list, got {value!r}"])


def _number(value: object, where: str) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    raise ConfigError([f"Calculon system: {where} must be a number, got {value!r}"])


def _key(table: Mapping[str, object], key: str, where: str) -> object:
    if key not in table:
        raise ConfigError([f"Calculon system: {where} lacks {key!r}"])
    return table[key]


def _steps(pairs: object, scale: float, where: str) -> SteppedEfficiency:
    steps = []
    for index, pair in enumerate(_list(pairs, where)):
        items = _list(pair, f"{where}[{index}]")
        if len(items) != 2:
            raise ConfigError([f"Calculon system: {where}[{index}] must be a pair"])
        steps.append(
            EfficiencyStep(
                threshold=_number(items[0], f"{where}[{index}][0]") * scale,
                fraction=_number(items[1], f"{where}[{index}][1]"),
            )
        )
    return SteppedEfficiency(steps=tuple(steps))


def _engine(value: object, where: str) -> ComputeEngineSpec:
    rates = []
    for key, raw in _table(value, where).items():
        at = f"{where}.{key}"
        if key not in {member.value for member in Datatype}:
            raise UnsupportedError(f"checking Calculon system: unknown datatype {key!r} in {where}")
        entry = _table(raw, at)
        rates.append(
            DatatypeRate(
                datatype=Datatype(key),
                peak_flop_per_s=_number(_key(entry, "tflops", at), f"{at}.tflops") * TERA,
                efficiency=_steps(
                    _key(entry, "gflops_efficiency", at), GIGA, f"{at}.gflops_efficiency"
                ),
            )
        )
    return ComputeEngineSpec(rates=tuple(rates))


def _memory(value: object, where: str) -> MemorySpec:
    entry = _table(value, where)
    return MemorySpec(
        capacity_bytes=_number(_key(entry, "GiB", where), f"{where}.GiB") * GIBI,
        bandwidth_bytes_per_s=_number(_key(entry, "GBps", where), f"{where}.GBps") * GIGA,
        efficiency=_steps(_key(entry, "MB_efficiency", where), MEGA, f"{where}.MB_efficiency"),
    )


def _cost(value: object, where: str) -> CollectiveCost:
    items = _list(value, where)
    if len(items) != 2:
        raise ConfigError([f"Calculon system: {where} must be [scalar, offset]"])
    offset = None if items[1] is None else _number(items[1], f"{where}[1]")
    return CollectiveCost(scalar=_number(items[0], f"{where}[0]"), offset=offset)


def _link(value: object, where: str) -> tuple[LinkSpec, int]:
    entry = _table(value, where)
    ops = _table(_key(entry, "ops", where), f"{where}.ops")
    costs = CollectiveCosts(
        all_reduce=_cost(_key(ops, "all_reduce", where), f"{where}.ops.all_reduce"),
        reduce_scatter=_cost(_key(ops, "reduce_scatter", where), f"{where}.ops.reduce_scatter"),
        all_gather=_cost(_key(ops, "all_gather", where), f"{where}.ops.all_gather"),
        p2p=_cost(_key(ops, "p2p", where), f"{where}.ops.p2p"),
    )
    link = LinkSpec(
        bandwidth_bytes_per_s=_number(_key(entry, "bandwidth", where), f"{where}.bandwidth") * GIGA,
        latency_s=_number(_key(entry, "latency", where), f"{where}.latency"),
        efficiency=ConstantEfficiency(
            fraction=_number(_key(entry, "efficiency", where), f"{where}.efficiency")
        ),
        costs=costs,
        processor_usage=_number(entry.get("processor_usage", 0.0), f"{where}.processor_usage"),
    )
    size = _number(_key(entry, "size", where), f"{where}.size")
    return link, int(size)


def _tier(index: int, what: str) -> LinkTier:
    match index:
        case 0:
            return LinkTier.INTRA_NODE
        case 1:
            return LinkTier.SCALE_OUT
        case _:
            raise UnsupportedError(
                f"checking Calculon execution: {what} = {index} names no tier of a 2-tier system"
            )


def system_from_calculon(
    sys_json: Mapping[str, object],
    *,
    tensor_par_net: int,
    pipeline_par_net: int,
    data_par_net: int,
    name: str = "calculon",
) -> SystemSpec:
    """A :class:`SystemSpec` that costs exactly as Calculon's ``System`` does (see module doc)."""
    networks = _list(_key(sys_json, "networks", "sys"), "networks")
    if len(networks) != 2:
        raise UnsupportedError(
            f"checking Calculon system: only 2 network tiers are modelled, got {len(networks)}"
        )
    intra, gpus_per_node = _link(networks[0], "networks[0]")
    scale_out, _ = _link(networks[1], "networks[1]")
    mode_text = _key(sys_json, "processing_mode", "sys")
    if mode_text not in {member.value for member in ProcessingMode}:
        raise ConfigError([f"Calculon system: unknown processing_mode {mode_text!r}"])
    offload = None
    if "mem2" in sys_json:
        mem2 = _table(sys_json["mem2"], "mem2")
        # Calculon's "no offload memory" systems give mem2 a capacity of 0.
        if _number(_key(mem2, "GiB", "mem2"), "mem2.GiB") > 0:
            offload = _memory(mem2, "mem2")
    return SystemSpec(
        name=name,
        accelerator=AcceleratorSpec(
            name=name,
            matrix=_engine(_key(sys_json, "matrix", "sys"), "matrix"),
            vector=_engine(_key(sys_json, "vector", "sys"), "vector"),
            hbm=_memory(_key(sys_json, "mem1", "sys"), "mem1"),
            offload=offload,
        ),
        node=NodeSpec(gpus_per_node=gpus_per_node, link=intra),
        scale_out=scale_out,
        processing_mode=ProcessingMode(str(mode_text)),
        network_assignment=FixedTiers(
            tensor=_tier(tensor_par_net, "tensor_par_net"),
            pipeline=_tier(pipeline_par_net, "pipeline_par_net"),
            data=_tier(data_par_net, "data_par_net"),
        ),
    )
