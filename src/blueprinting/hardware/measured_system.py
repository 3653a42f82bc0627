"""A system calibrated on a user's own microbenchmarks (``blueprinting calibrate --gemm / --nccl
/ --stream``): the fits of :mod:`blueprinting.hardware.fit` applied to a preset as a ``[system]``
section.

What each input sets, over the ``--system`` preset (every other figure stays the preset's):

* ``--gemm``: per datatype in the CSV, ``[system.accelerator.matrix.<datatype>].efficiency`` =
  the fitted :class:`~blueprinting.hardware.efficiency.GemmShapeEfficiency` against the
  preset's peak for that datatype (a datatype the preset lacks is refused).
* ``--nccl`` (repeatable): the rows of every file of one scope (intra: ``[system.intra_node]``,
  inter: ``[system.scale_out]``) fitted as one link: the ring collectives' files
  (``all_reduce_perf``, ``all_gather_perf``, ``reduce_scatter_perf``) set ``latency_s`` and a
  constant ``efficiency`` = fitted rate / the preset link's bandwidth; ``alltoall_perf`` files,
  fitted apart, set ``all_to_all_efficiency`` (NCCL's all-to-all is grouped send / receive, not
  a ring: :func:`~blueprinting.hardware.collectives.link_efficiency`). Across hosts an
  all-to-all's busbw counts the bytes a rank sends over NVLink too; the NIC carries
  ``(n - c) / (n - 1)`` of them (c = ranks per host), the share the scale-out figure is of.
* ``--stream``: ``[system.accelerator.hbm].efficiency`` = Triad / the preset's HBM bandwidth.

The section is read back by :func:`~blueprinting.hardware.system_mapping.system_from_mapping`
before it is returned, so what is written is a system every command accepts.

Public API: ``NcclInput``, ``CalibratedOps``, ``calibrated_ops``, ``MeasuredCalibration``,
``calibrate_measured(...)``.
"""

from __future__ import annotations

import dataclasses
import itertools
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import assert_never, final

from blueprinting.errors import ConfigError
from blueprinting.hardware.collectives import CollectiveKind
from blueprinting.hardware.fit import (
    CollectivePoint,
    FitError,
    GemmFit,
    GemmPoint,
    HbmFit,
    LinkFit,
    StreamRate,
    fit_gemm,
    fit_hbm,
    fit_link,
    link_efficiency,
    toml_inline,
)
from blueprinting.hardware.measurement_files import LinkScope, NcclTestsRun
from blueprinting.hardware.system import LinkSpec, SystemSpec
from blueprinting.hardware.system_mapping import efficiency_to_mapping, system_from_mapping
from blueprinting.mapping.model import Datatype


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class NcclInput:
    """One nccl-tests file, read, with the link it measured."""

    path: Path
    run: NcclTestsRun
    scope: LinkScope


class CalibratedOps(StrEnum):
    """Which of a link's efficiencies a set of nccl-tests files sets (module docstring)."""

    RING = "ring collectives"
    ALL_TO_ALL = "all-to-all"


def calibrated_ops(op: CollectiveKind) -> CalibratedOps:
    match op:
        case CollectiveKind.ALL_REDUCE | CollectiveKind.ALL_GATHER | CollectiveKind.REDUCE_SCATTER:
            return CalibratedOps.RING
        case CollectiveKind.ALL_TO_ALL:
            return CalibratedOps.ALL_TO_ALL
        case CollectiveKind.P2P:
            # nccl-tests' sendrecv_perf is not read (measurement_files); kept with the rings
            return CalibratedOps.RING
        case _ as unreachable:
            assert_never(unreachable)


def _ranks_per_domain(system: SystemSpec, run: NcclTestsRun) -> int:
    """The ranks of ``run`` that share one NVLink domain: its ranks per host times the hosts a
    domain holds (one on a DGX; 18 trays of an NVL72 rack), the hosts taken in order."""
    node = system.node
    hosts_per_domain = (node.nvlink_domain_size or node.gpus_per_node) // node.gpus_per_node
    return min(run.group_size, run.group_size // run.hosts * max(1, hosts_per_domain))


def _nic_share(point: CollectivePoint, ranks_per_domain: int) -> CollectivePoint:
    """An all-to-all row as the NIC's share: busbw x (n - c) / (n - 1), c the ranks that share
    an NVLink domain (module docstring)."""
    n, c = point.group_size, ranks_per_domain
    return dataclasses.replace(
        point, bus_bandwidth_bytes_per_s=point.bus_bandwidth_bytes_per_s * (n - c) / (n - 1)
    )


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class LinkCalibration:
    scope: LinkScope
    ops: CalibratedOps
    fit: LinkFit
    link_bandwidth_bytes_per_s: float
    efficiency: float
    #: Per file: its fit error under the joint fit of its scope.
    per_file: tuple[tuple[NcclInput, FitError], ...]


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class MeasuredCalibration:
    preset: str
    system: SystemSpec
    gemm: Mapping[Datatype, GemmFit]
    links: tuple[LinkCalibration, ...]
    hbm: HbmFit | None
    section: Mapping[str, object]
    sources: tuple[str, ...]

    def report(self) -> str:
        """The fit error per input, one line each."""
        lines = []
        for datatype, fit in self.gemm.items():
            model = fit.model
            lines.append(
                f"gemm {datatype}: peak_fraction {model.peak_fraction:.3f}, "
                f"half_saturation_dim {model.half_saturation_dim:.3g}, half_saturation_flops "
                f"{model.half_saturation_flops:.3g}; fitted {fit.fitted}; "
                f"leave-one-out {fit.held_out}"
            )
        for link in self.links:
            lines.append(
                f"{link.scope} link, {link.ops}: latency {link.fit.latency_s * 1e6:.1f} us, "
                "bus bandwidth "
                f"{link.fit.bandwidth_bytes_per_s / 1e9:.1f} GB/s = {link.efficiency:.3f} of "
                f"{link.link_bandwidth_bytes_per_s / 1e9:.1f} GB/s; fitted {link.fit.fitted}"
            )
            for source, error in link.per_file:
                lines.append(
                    f"  {source.path}: {source.run.op} over {source.run.group_size} ranks on "
                    f"{source.run.hosts} host(s): {error}"
                )
        if self.hbm is not None:
            ratios = ", ".join(f"{k} {v:.3f}" for k, v in self.hbm.ratios.items())
            lines.append(f"hbm: Triad {self.hbm.efficiency.fraction:.3f} of datasheet ({ratios})")
        return "\n".join(lines)

    def toml(self) -> str:
        """The ``[system]`` section, with a comment naming its inputs."""
        lines = [f"# blueprinting calibrate from: {', '.join(self.sources)}", "[system]"]
        tables: list[tuple[str, Mapping[str, object]]] = []
        for key, value in self.section.items():
            if isinstance(value, Mapping):
                _flatten(f"system.{key}", value, tables)
            else:
                lines.append(f"{key} = {toml_inline(value)}")
        for name, table in tables:
            lines.append(f"[{name}]")
            lines.extend(f"{key} = {toml_inline(value)}" for key, value in table.items())
        return "\n".join(lines) + "\n"


def _flatten(
    name: str, table: Mapping[str, object], out: list[tuple[str, Mapping[str, object]]]
) -> None:
    """Nested tables as ``[a.b.c]`` headers; an ``efficiency`` table stays inline (it is one
    value that replaces the preset's whole model)."""
    scalars = {k: v for k, v in table.items() if not isinstance(v, Mapping) or k == "efficiency"}
    if scalars:
        out.append((name, scalars))
    for key, value in table.items():
        if isinstance(value, Mapping) and key != "efficiency":
            _flatten(f"{name}.{key}", value, out)


def _link_of(system: SystemSpec, scope: LinkScope) -> tuple[str, LinkSpec]:
    match scope:
        case LinkScope.INTRA:
            return "intra_node", system.node.link
        case LinkScope.INTER:
            return "scale_out", system.scale_out
        case _ as unreachable:
            assert_never(unreachable)


def calibrate_measured(
    system: SystemSpec,
    preset: str,
    *,
    gemm: Mapping[Datatype, Sequence[GemmPoint]] | None = None,
    gemm_source: str = "",
    nccl: Sequence[NcclInput] = (),
    stream: Sequence[StreamRate] | None = None,
    stream_source: str = "",
) -> MeasuredCalibration:
    """Fit every input given and return the ``[system]`` section over ``preset``."""
    section: dict[str, object] = {"preset": preset}
    accelerator: dict[str, object] = {}
    sources: list[str] = []
    gemm_fits: dict[Datatype, GemmFit] = {}
    problems: list[str] = []
    if gemm is not None:
        sources.append(f"gemm {gemm_source}")
        matrix: dict[str, object] = {}
        rates = {rate.datatype: rate for rate in system.accelerator.matrix.rates}
        for datatype, points in gemm.items():
            rate = rates.get(datatype)
            if rate is None:
                problems.append(
                    f"{gemm_source}: {system.name} has no {datatype} matrix rate to calibrate "
                    f"(it has {', '.join(str(d) for d in rates)})"
                )
                continue
            try:
                fit = fit_gemm(points, rate.peak_flop_per_s)
            except ConfigError as error:
                problems.extend(f"{gemm_source}: {datatype}: {p}" for p in error.problems)
                continue
            gemm_fits[datatype] = fit
            matrix[datatype.value] = {"efficiency": efficiency_to_mapping(fit.model)}
        if matrix:
            accelerator["matrix"] = matrix
    links: list[LinkCalibration] = []
    for scope, ops in itertools.product(LinkScope, CalibratedOps):
        inputs = [
            item for item in nccl if item.scope == scope and calibrated_ops(item.run.op) is ops
        ]
        if not inputs:
            continue
        key, link = _link_of(system, scope)
        nic = scope is LinkScope.INTER and ops is CalibratedOps.ALL_TO_ALL
        one_domain = [
            item
            for item in inputs
            if nic and _ranks_per_domain(system, item.run) >= item.run.group_size
        ]
        if one_domain:
            problems.extend(
                f"{item.path}: an all-to-all over {item.run.group_size} ranks on "
                f"{item.run.hosts} host(s) stays inside one NVLink domain of {system.name} and "
                "sends nothing over a NIC, so it cannot set the scale-out link's "
                "all_to_all_efficiency; give it to --nccl-scope intra, or run alltoall_perf "
                "across NVLink domains"
                for item in one_domain
            )
            continue
        rows_of = {
            id(item): tuple(
                _nic_share(point, _ranks_per_domain(system, item.run)) if nic else point
                for point in item.run.points
            )
            for item in inputs
        }
        rows = [point for item in inputs for point in rows_of[id(item)]]
        sources.extend(f"nccl {item.path} ({scope})" for item in inputs)
        try:
            line = fit_link(rows)
            efficiency = link_efficiency(
                line, link.bandwidth_bytes_per_s, all_to_all=ops is CalibratedOps.ALL_TO_ALL
            )
        except ConfigError as error:
            names = ", ".join(str(item.path) for item in inputs)
            problems.extend(f"{names} ({scope} link, {ops}): {p}" for p in error.problems)
            continue
        links.append(
            LinkCalibration(
                scope=scope,
                ops=ops,
                fit=line,
                link_bandwidth_bytes_per_s=link.bandwidth_bytes_per_s,
                efficiency=efficiency.fraction,
                per_file=tuple(
                    (item, FitError.of(line.errors(rows_of[id(item)]))) for item in inputs
                ),
            )
        )
        table = section.setdefault(key, {})
        assert isinstance(table, dict)
        match ops:
            case CalibratedOps.RING:
                table.update({"latency_s": line.latency_s, "efficiency": efficiency.fraction})
            case CalibratedOps.ALL_TO_ALL:
                table["all_to_all_efficiency"] = efficiency.fraction
            case _ as unreachable:
                assert_never(unreachable)
    hbm_fit: HbmFit | None = None
    if stream is not None:
        sources.append(f"stream {stream_source}")
        try:
            hbm_fit = fit_hbm(stream, system.accelerator.hbm.bandwidth_bytes_per_s)
        except ConfigError as error:
            problems.extend(f"{stream_source}: {p}" for p in error.problems)
        else:
            accelerator["hbm"] = {"efficiency": hbm_fit.efficiency.fraction}
    if problems:
        raise ConfigError(problems)
    if accelerator:
        section["accelerator"] = accelerator
    result = MeasuredCalibration(
        preset=preset,
        system=system,
        gemm=gemm_fits,
        links=tuple(links),
        hbm=hbm_fit,
        section=section,
        sources=tuple(sources),
    )
    # What is written must read back: parse the TOML text and build the system from it.
    written = tomllib.loads(result.toml())["system"]
    return dataclasses.replace(
        result, system=system_from_mapping(written, source="calibrate output")
    )
