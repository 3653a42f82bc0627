"""A user's microbenchmark output files, read into the points :mod:`blueprinting.hardware.fit`
fits (``blueprinting calibrate --gemm / --nccl / --stream``).

* GEMM sweep -- CSV with a header naming the columns ``M``, ``N``, ``K``, ``dtype`` and
  ``TFLOP/s`` (also ``tflops`` / ``TFLOPS``; any order, any other columns ignored; ``#`` lines
  are comments), one GEMM per row, ``K`` the reduction dimension, as mamf-finder-style sweeps
  print (``C[M, N] = A[M, K] @ B[K, N]``). ``dtype``: ``bf16``, ``fp16``, ``fp8`` (or
  ``e4m3`` / ``e5m2``), ``fp32`` / ``tf32``, or the project's datatype names.
* nccl-tests -- the standard text output of ``all_reduce_perf``, ``all_gather_perf``,
  ``reduce_scatter_perf`` and ``alltoall_perf`` (NVIDIA/nccl-tests ``src/common.cu``): the
  ``#  Rank ... on HOST device ...`` lines give the group size and the hosts (one host: intra
  node), the ``#  size count type redop root time algbw busbw #wrong ...`` header the columns;
  each data row's out-of-place ``size`` (bytes) and ``busbw`` (GB/s, 1e9) are read. The op comes
  from ``# Collective test starting: NAME_perf`` (nccl-tests 2.13 and later) or is given.
* BabelStream -- its result table (``Function  MBytes/sec  Min (sec)  Max  Average``, or
  ``MiBytes/sec`` / ``GBytes/sec`` / ``GiBytes/sec``), rows ``Copy``, ``Mul``, ``Add``,
  ``Triad``, ``Dot`` (others, such as ``Nstream``, ignored).

Every problem of a file is reported at once, each with its line number, in one
:class:`~blueprinting.errors.ConfigError` whose source is the file.

Public API: ``read_gemm_csv(path)``, ``NcclTestsRun``, ``read_nccl_tests(path, op=None)``,
``read_babelstream(path)``, ``LinkScope``.
"""

from __future__ import annotations

import csv
import difflib
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import final

from blueprinting.errors import ConfigError
from blueprinting.hardware.collectives import CollectiveKind
from blueprinting.hardware.efficiency import GemmShape
from blueprinting.hardware.fit import CollectivePoint, GemmPoint, StreamKernel, StreamRate
from blueprinting.mapping.documents import read_text
from blueprinting.mapping.model import Datatype

TERA = 1e12
GIGA = 1e9


class LinkScope(StrEnum):
    """Which link of a system a nccl-tests run measured."""

    INTRA = "intra"
    INTER = "inter"


_DTYPES: Mapping[str, Datatype] = {
    "bf16": Datatype.BF16,
    "bfloat16": Datatype.BF16,
    "fp16": Datatype.FP16,
    "float16": Datatype.FP16,
    "half": Datatype.FP16,
    "fp8": Datatype.FP8,
    "float8": Datatype.FP8,
    "e4m3": Datatype.FP8,
    "e5m2": Datatype.FP8,
    "fp8_e4m3": Datatype.FP8,
    "fp32": Datatype.FP32,
    "float32": Datatype.FP32,
    "tf32": Datatype.FP32,
}
_GEMM_COLUMNS: Mapping[str, tuple[str, ...]] = {
    "M": ("m",),
    "N": ("n",),
    "K": ("k",),
    "dtype": ("dtype", "datatype"),
    "TFLOP/s": ("tflop/s", "tflops", "tflop/sec"),
}
_NCCL_OPS: Mapping[str, CollectiveKind] = {
    "all_reduce": CollectiveKind.ALL_REDUCE,
    "all_gather": CollectiveKind.ALL_GATHER,
    "reduce_scatter": CollectiveKind.REDUCE_SCATTER,
    "alltoall": CollectiveKind.ALL_TO_ALL,
}
_STREAM_UNITS: Mapping[str, float] = {
    "mbytes/sec": 1e6,
    "gbytes/sec": 1e9,
    "mibytes/sec": 2.0**20,
    "gibytes/sec": 2.0**30,
}


def _positive(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if value > 0 and math.isfinite(value) else None


def _positive_int(text: str) -> int | None:
    try:
        value = int(text)
    except ValueError:
        return None
    return value if value > 0 else None


def read_gemm_csv(path: Path) -> dict[Datatype, tuple[GemmPoint, ...]]:
    """The GEMM points of a sweep CSV, by datatype (module docstring)."""
    text = read_text(path, what="GEMM sweep")
    source = str(path)
    numbered = [
        (number, line)
        for number, line in enumerate(text.splitlines(), start=1)
        if line.strip() and not line.lstrip().startswith("#")
    ]
    if not numbered:
        raise ConfigError(
            ["no header and no rows: expected M, N, K, dtype, TFLOP/s"], source=source
        )
    header_number, header_line = numbered[0]
    header = [cell.strip().lower() for cell in next(csv.reader([header_line]))]
    index: dict[str, int] = {}
    missing = []
    for name, aliases in _GEMM_COLUMNS.items():
        found = next((i for i, cell in enumerate(header) if cell in aliases), None)
        if found is None:
            missing.append(name)
        else:
            index[name] = found
    if missing:
        raise ConfigError(
            [
                f"line {header_number}: the header lacks column(s) {', '.join(missing)} "
                f"(got {', '.join(header)})"
            ],
            source=source,
        )
    problems: list[str] = []
    points: dict[Datatype, list[GemmPoint]] = {}
    for number, line in numbered[1:]:
        cells = [cell.strip() for cell in next(csv.reader([line]))]
        if len(cells) < len(header):
            problems.append(f"line {number}: {len(cells)} field(s), the header has {len(header)}")
            continue
        dims = [_positive_int(cells[index[name]]) for name in ("M", "N", "K")]
        rate = _positive(cells[index["TFLOP/s"]])
        dtype_text = cells[index["dtype"]].lower()
        dtype = _DTYPES.get(dtype_text)
        bad = [
            f"{name} {cells[index[name]]!r} is not a positive integer"
            for name, dim in zip(("M", "N", "K"), dims, strict=True)
            if dim is None
        ]
        if rate is None:
            bad.append(f"TFLOP/s {cells[index['TFLOP/s']]!r} is not a positive number")
        if dtype is None:
            close = difflib.get_close_matches(dtype_text, list(_DTYPES), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            bad.append(f"unknown dtype {dtype_text!r}{hint}; choices: bf16, fp16, fp8, fp32")
        m, n, k = dims
        if bad or m is None or n is None or k is None or rate is None or dtype is None:
            problems.extend(f"line {number}: {problem}" for problem in bad)
            continue
        points.setdefault(dtype, []).append(
            GemmPoint(shape=GemmShape(m=m, n=n, k=k), flop_per_s=rate * TERA)
        )
    if problems:
        raise ConfigError(problems, source=source)
    if not points:
        raise ConfigError([f"line {header_number}: a header and no rows"], source=source)
    return {dtype: tuple(rows) for dtype, rows in points.items()}


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class NcclTestsRun:
    """One nccl-tests output: its op, ranks, hosts and rows."""

    op: CollectiveKind
    group_size: int
    hosts: int
    points: tuple[CollectivePoint, ...]

    @property
    def detected_scope(self) -> LinkScope:
        """One host: the intra-node link; several: the scale-out link."""
        return LinkScope.INTRA if self.hosts == 1 else LinkScope.INTER


_RANK_LINE = re.compile(r"^#\s+Rank\s+\d+\s+Group\s+\d+\s+Pid\s+\d+\s+on\s+(\S+)\s+device")
_STARTING = re.compile(r"^#\s*Collective test starting:\s*(\w+?)_perf\b")


def read_nccl_tests(path: Path, op: CollectiveKind | None = None) -> NcclTestsRun:
    """The out-of-place rows of one nccl-tests output (module docstring)."""
    text = read_text(path, what="nccl-tests output")
    source = str(path)
    hosts: list[str] = []
    detected: CollectiveKind | None = None
    columns: list[str] | None = None
    header_number = 0
    problems: list[str] = []
    rows: list[tuple[int, float, float]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("#"):
            if rank := _RANK_LINE.match(stripped):
                hosts.append(rank.group(1))
            elif starting := _STARTING.match(stripped):
                name = starting.group(1)
                detected = _NCCL_OPS.get(name)
                if detected is None:
                    problems.append(
                        f"line {number}: {name}_perf is not a collective the link model costs "
                        f"(choices: {', '.join(f'{o}_perf' for o in _NCCL_OPS)})"
                    )
            elif columns is None and _is_header(stripped):
                columns = stripped.lstrip("#").split()
                header_number = number
            continue
        if columns is None:
            problems.append(f"line {number}: a data row before the nccl-tests column header")
            continue
        fields = stripped.split()
        if len(fields) != len(columns):
            problems.append(
                f"line {number}: {len(fields)} field(s), the header on line {header_number} "
                f"has {len(columns)} (a truncated row?)"
            )
            continue
        size = _positive(fields[columns.index("size")])
        busbw = _positive(fields[columns.index("busbw")])
        if size is None or busbw is None:
            # nccl-tests prints a busbw of 0.00 for the smallest sizes: nothing to fit there.
            if size is not None and _nonnegative(fields[columns.index("busbw")]):
                continue
            problems.append(f"line {number}: size or busbw is not a number ({stripped!r})")
            continue
        rows.append((number, size, busbw))
    kind = op if op is not None else detected
    if columns is None:
        problems.append("no nccl-tests column header (#  size  count  type ... busbw ...) found")
    if not hosts:
        problems.append(
            "no '#  Rank N Group G Pid P on HOST device D' lines: the group size is unknown"
        )
    if kind is None:
        problems.append(
            "the op is not named in the file (no '# Collective test starting: NAME_perf' line); "
            "pass --nccl-op"
        )
    if columns is not None and not rows and not problems:
        problems.append(f"line {header_number}: a column header and no data rows")
    if not problems and len(hosts) < 2:
        problems.append(f"{len(hosts)} rank(s): a collective needs at least 2")
    if problems or kind is None:
        raise ConfigError(problems, source=source)
    group_size = len(hosts)
    points = tuple(
        CollectivePoint(
            kind=kind,
            group_size=group_size,
            size_bytes=size,
            bus_bandwidth_bytes_per_s=busbw * GIGA,
        )
        for _, size, busbw in rows
    )
    return NcclTestsRun(op=kind, group_size=group_size, hosts=len(set(hosts)), points=points)


def _is_header(line: str) -> bool:
    """``#  size  count  type ... busbw ...``: the first word is ``size``."""
    words = line.lstrip("#").split()
    return bool(words) and words[0] == "size" and "busbw" in words


def _nonnegative(text: str) -> bool:
    try:
        return float(text) >= 0
    except ValueError:
        return False


def read_babelstream(path: Path) -> tuple[StreamRate, ...]:
    """The kernel rates of one BabelStream run (module docstring)."""
    text = read_text(path, what="BabelStream output")
    source = str(path)
    scale: float | None = None
    problems: list[str] = []
    rates: list[StreamRate] = []
    kernels = {kernel.value: kernel for kernel in StreamKernel}
    for number, line in enumerate(text.splitlines(), start=1):
        fields = line.split()
        if not fields:
            continue
        if fields[0] == "Function":
            unit = fields[1].lower() if len(fields) > 1 else ""
            scale = _STREAM_UNITS.get(unit)
            if scale is None:
                problems.append(
                    f"line {number}: unknown rate unit {fields[1] if len(fields) > 1 else ''!r} "
                    f"(expected {', '.join(_STREAM_UNITS)})"
                )
            continue
        kernel = kernels.get(fields[0].lower())
        if kernel is None or scale is None:
            continue
        value = _positive(fields[1]) if len(fields) > 1 else None
        if value is None or len(fields) < 5:
            problems.append(
                f"line {number}: a {fields[0]} row needs a rate and min / max / average times, "
                f"got {line.strip()!r}"
            )
            continue
        rates.append(StreamRate(kernel=kernel, bytes_per_s=value * scale))
    if scale is None and not problems:
        problems.append("no BabelStream result table (a 'Function  MBytes/sec ...' line) found")
    if not problems and StreamKernel.TRIAD not in {rate.kernel for rate in rates}:
        problems.append("the result table has no Triad row (a truncated run?)")
    if problems:
        raise ConfigError(problems, source=source)
    return tuple(rates)
