"""A sweep's output folder: rows kept as cells finish, so a killed sweep resumes.

Layout of ``--out DIR``:

- ``sweep.json``: the search options the rows were computed with (a rerun with other options is
  refused: its rows would not be comparable);
- ``parts/part-*.parquet``: the journal, one small Parquet file per batch of finished cells,
  each written to a temporary name and renamed (a kill leaves no half file under a part name);
- ``sweep.parquet``: every row, written when a run completes (the parts it holds are removed);
- ``sweep.csv``: the same rows as CSV, appended to as cells finish and rewritten whole at the
  start of a run (dropping a line a kill cut short) and at its end.

The rows of a folder are those of ``sweep.parquet`` and of the parts, the first of each cell kept
(a kill between writing ``sweep.parquet`` and removing the parts leaves both, with equal rows).
A lock (``flock`` on ``.lock``) keeps two runs from writing one folder; the kernel releases it
when its holder dies, even by SIGKILL.
"""

from __future__ import annotations

import csv
import fcntl
import json
import os
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from blueprinting.errors import ConfigError
from blueprinting.sweep.cell import RECORD_COLUMNS, SweepRow, row_from_record
from blueprinting.sweep.definition import CellSearchOptions

if TYPE_CHECKING:
    import pyarrow as pa

    from blueprinting.analysis.report import JsonValue

MANIFEST_FORMAT = 1
PARQUET_NAME = "sweep.parquet"
CSV_NAME = "sweep.csv"
MANIFEST_NAME = "sweep.json"

Prices = Callable[[str], float | None]


def record_schema() -> pa.Schema:
    import pyarrow as pa

    text, integer, real = pa.string(), pa.int64(), pa.float64()
    types = {
        "model": text,
        "system": text,
        "gpus": integer,
        "global_batch": integer,
        "seq_length": integer,
        "status": text,
        "reason": text,
        "strategy_text": text,
        "megatron_args": pa.list_(text),
        "iteration_time_s": real,
        "tokens_per_second": real,
        "mfu": real,
        "memory_reserved_peak_bytes": integer,
        "memory_limit_bytes": integer,
        "train_tokens": integer,
        "time_to_train_s": real,
        "gpu_hours": real,
        "price_usd_per_gpu_hour": real,
        "cost_usd": real,
        "candidates_enumerated": integer,
        "candidates_valid": integer,
        "candidates_fit": integer,
    }
    assert tuple(types) == RECORD_COLUMNS
    return pa.schema([pa.field(name, kind) for name, kind in types.items()])


def _csv_value(value: JsonValue) -> str:
    if value is None:
        return ""
    if isinstance(value, list):
        return " ".join(str(v) for v in value)
    if isinstance(value, float):
        return repr(value)
    return str(value)


class SweepStore:
    """The output folder of one run (use as a context manager: it holds the folder's lock)."""

    def __init__(self, out: Path, options: CellSearchOptions) -> None:
        self.out = out
        self.options = options
        self._lock: TextIO | None = None
        self._rows: dict[str, SweepRow] = {}
        self._parts_read: list[Path] = []
        self._csv: TextIO | None = None
        self._written = 0

    # -- opening -------------------------------------------------------------------------
    def __enter__(self) -> SweepStore:
        try:
            (self.out / "parts").mkdir(parents=True, exist_ok=True)
            lock = (self.out / ".lock").open("w")
        except OSError as error:
            raise ConfigError(
                [f"cannot create the output folder: {error.strerror or error}"],
                source=str(self.out),
            ) from None
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            raise ConfigError(
                ["another sweep is writing this output folder (its lock is held)"],
                source=str(self.out),
            ) from None
        self._lock = lock
        self._check_manifest()
        self._load()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._csv is not None:
            self._csv.close()
            self._csv = None
        if self._lock is not None:
            self._lock.close()  # releases the flock
            self._lock = None

    def _check_manifest(self) -> None:
        path = self.out / MANIFEST_NAME
        wanted: dict[str, object] = {"format": MANIFEST_FORMAT, "options": self.options.to_json()}
        if path.exists():
            try:
                found = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as error:
                raise ConfigError(
                    [f"{MANIFEST_NAME} is unreadable ({error}); choose another --out"],
                    source=str(self.out),
                ) from None
            if found != wanted:
                before = found.get("options", {}) if isinstance(found, dict) else {}
                now = self.options.to_json()
                differ = [
                    f"{key} was {before.get(key)!r}, this run has {value!r}"
                    for key, value in now.items()
                    if not isinstance(before, dict) or before.get(key) != value
                ] or [f"{MANIFEST_NAME} is {found!r}, not a sweep manifest of this version"]
                raise ConfigError(
                    [
                        f"the folder holds rows computed with other search options: "
                        f"{'; '.join(differ)} (choose another --out, or rerun with its options)"
                    ],
                    source=str(self.out),
                )
            return
        _atomic_write(path, lambda stream: json.dump(wanted, stream, indent=2))

    def _read_table(self, path: Path) -> list[dict[str, object]]:
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path)
        except (OSError, ValueError) as error:
            raise ConfigError(
                [f"{path.name} is not a readable Parquet file ({error}); choose another --out"],
                source=str(self.out),
            ) from None
        if table.schema != record_schema():
            raise ConfigError(
                [f"{path.name} has columns {table.schema.names}, not a sweep's"],
                source=str(self.out),
            )
        rows: list[dict[str, object]] = table.to_pylist()
        return rows

    def _load(self) -> None:
        paths = [self.out / PARQUET_NAME] if (self.out / PARQUET_NAME).exists() else []
        parts = self.out / "parts"
        for stale in parts.glob("*.tmp"):
            stale.unlink()  # a write a kill interrupted
        self._parts_read = sorted(parts.glob("part-*.parquet"))
        for path in [*paths, *self._parts_read]:
            for record in self._read_table(path):
                row = row_from_record(record)
                self._rows.setdefault(row.cell.key, row)

    # -- rows ----------------------------------------------------------------------------
    @property
    def rows(self) -> dict[str, SweepRow]:
        """Every row of the folder by cell key, in the order first written."""
        return self._rows

    def start_csv(self, prices: Prices) -> None:
        """Rewrite ``sweep.csv`` from the rows held, then keep it open for appending."""
        path = self.out / CSV_NAME
        _atomic_write(path, lambda stream: _write_csv(stream, self._rows.values(), prices))
        self._csv = path.open("a", newline="", encoding="utf-8")

    def append(self, rows: Sequence[SweepRow], prices: Prices) -> None:
        """Keep ``rows`` (cells just finished): one Parquet part, then the CSV lines."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        new = [r for r in rows if r.cell.key not in self._rows]
        if not new:
            return
        self._written += 1
        name = f"part-{time.time_ns():020d}-{os.getpid()}-{self._written:06d}.parquet"
        table = pa.Table.from_pylist(
            [r.record(prices(r.cell.system)) for r in new], schema=record_schema()
        )
        final = self.out / "parts" / name
        temporary = final.with_suffix(".tmp")
        pq.write_table(table, temporary)
        os.replace(temporary, final)
        for row in new:
            self._rows[row.cell.key] = row
        if self._csv is not None:
            writer = csv.writer(self._csv)
            for row in new:
                record = row.record(prices(row.cell.system))
                writer.writerow([_csv_value(record[c]) for c in RECORD_COLUMNS])
            self._csv.flush()

    def finish(self, order: Sequence[str], prices: Prices) -> None:
        """Write ``sweep.parquet`` and ``sweep.csv`` whole: the cells of ``order`` first (the
        current grid), then any other row of the folder; then drop the parts they hold."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        keys = [k for k in order if k in self._rows]
        keys += [k for k in self._rows if k not in set(order)]
        rows = [self._rows[k] for k in keys]
        table = pa.Table.from_pylist(
            [r.record(prices(r.cell.system)) for r in rows], schema=record_schema()
        )
        _atomic_write_binary(self.out / PARQUET_NAME, lambda path: pq.write_table(table, path))
        if self._csv is not None:
            self._csv.close()
            self._csv = None
        _atomic_write(self.out / CSV_NAME, lambda stream: _write_csv(stream, rows, prices))
        for part in sorted((self.out / "parts").glob("part-*.parquet")):
            part.unlink()


def _write_csv(stream: TextIO, rows: Iterable[SweepRow], prices: Prices) -> None:
    writer = csv.writer(stream)
    writer.writerow(RECORD_COLUMNS)
    for row in rows:
        record = row.record(prices(row.cell.system))
        writer.writerow([_csv_value(record[c]) for c in RECORD_COLUMNS])


def _atomic_write(path: Path, write: Callable[[TextIO], None]) -> None:
    temporary = path.with_name(path.name + ".tmp")
    with temporary.open("w", newline="", encoding="utf-8") as stream:
        write(stream)
    os.replace(temporary, path)


def _atomic_write_binary(path: Path, write: Callable[[Path], None]) -> None:
    temporary = path.with_name(path.name + ".tmp")
    write(temporary)
    os.replace(temporary, path)
