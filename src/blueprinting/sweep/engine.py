"""Running cells as Ray tasks (``ray`` from PyPI, imported only here and only when a sweep runs).

Two engines: :class:`LocalRay` starts a Ray instance for the run inside this process and shuts
it down after (nothing to set up: ``ray.init`` with no address); :class:`RayCluster` joins an
existing cluster by address (``ray.init(address=...)``; its nodes need blueprinting installed).
A process that has already called ``ray.init`` (a Ray program using the Python API, the test
suite's shared instance) keeps its instance: the sweep neither starts nor stops one.

Each cell is one task (``num_cpus=1``). At most ``workers`` tasks are in flight, so ``--workers``
also bounds a run on a large cluster, and a kill loses at most ``workers`` cells in progress.
A task whose worker process dies (killed, out of memory, ``os._exit``) is retried by Ray up to
``MAX_CELL_RETRIES`` times (``max_retries``); an exception raised by a cell is a bug and is not
retried (``retry_exceptions=False``): it stops the sweep with the cell named, after the rows
finished before it are kept.

Ray's defaults are trimmed for a planning tool: no usage statistics
(``RAY_USAGE_STATS_ENABLED=0``), no dashboard, a small object store (rows are a few hundred
bytes), and worker output not forwarded to the driver (stdout may carry ``--json``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias, assert_never, final

from blueprinting.errors import ConfigError, SweepError
from blueprinting.sweep.cell import SweepRow, evaluate_cell
from blueprinting.sweep.definition import Cell, CellSearchOptions

if TYPE_CHECKING:
    from blueprinting.analysis.report import JsonValue

#: Retries of a cell whose worker died (Ray's ``max_retries``).
MAX_CELL_RETRIES = 3

#: Ray's object store for a local instance: rows are small; Ray's floor is 75 MiB.
OBJECT_STORE_BYTES = 96 * 1024 * 1024

CellFunction = Callable[[Cell, CellSearchOptions], SweepRow]


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class LocalRay:
    """A Ray instance started for the run; ``workers`` CPUs (None: every core here)."""

    workers: int | None = None


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class RayCluster:
    """An existing Ray cluster; ``workers`` cells in flight (None: the cluster's CPUs)."""

    address: str
    workers: int | None = None


Engine: TypeAlias = LocalRay | RayCluster


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class EngineInfo:
    """What ran the cells (the ``engine`` object of ``sweep --json``)."""

    mode: str
    """``local`` (started for the run), ``cluster`` (joined by address) or ``existing`` (the
    calling process's own instance)."""
    address: str
    workers: int
    ray_version: str

    def to_json(self) -> dict[str, JsonValue]:
        return {
            "name": "ray",
            "version": self.ray_version,
            "mode": self.mode,
            "address": self.address,
            "workers": self.workers,
        }


def _workers_problem(workers: int | None) -> None:
    if workers is not None and workers < 1:
        raise ConfigError([f"--workers must be >= 1, got {workers}"], source="sweep")


@contextmanager
def ray_session(engine: Engine) -> Iterator[EngineInfo]:
    """Ray, started or joined as ``engine`` says, shut down after if this call started it."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray

    def cpus() -> int:
        resources: dict[str, float] = ray.cluster_resources()  # type: ignore[no-untyped-call]
        return max(1, int(resources.get("CPU", 1)))

    def info(mode: str, workers: int | None) -> EngineInfo:
        address = str(ray.get_runtime_context().gcs_address)
        return EngineInfo(
            mode=mode,
            address=address,
            workers=cpus() if workers is None else workers,
            ray_version=ray.__version__,
        )

    workers = engine.workers
    _workers_problem(workers)
    if ray.is_initialized():
        yield info("existing", workers)
        return
    mode: str
    match engine:
        case LocalRay():
            ray.init(
                num_cpus=workers or os.cpu_count() or 1,
                include_dashboard=False,
                object_store_memory=OBJECT_STORE_BYTES,
                log_to_driver=False,
                logging_level=logging.WARNING,
            )
            mode = "local"
        case RayCluster(address=address):
            try:
                ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
            except (ConnectionError, ValueError, RuntimeError) as error:
                raise ConfigError(
                    [f"--address {address!r}: cannot join a Ray cluster there ({error})"],
                    source="sweep",
                ) from None
            mode = "cluster"
        case _ as unreachable:
            assert_never(unreachable)
    try:
        yield info(mode, workers)
    finally:
        ray.shutdown()


def run_cells(
    cells: Sequence[Cell],
    options: CellSearchOptions,
    workers: int,
    *,
    on_rows: Callable[[list[SweepRow]], None],
    evaluate: CellFunction = evaluate_cell,
) -> None:
    """Evaluate ``cells`` as Ray tasks in the current Ray session, ``workers`` at a time; each
    batch of finished rows goes to ``on_rows`` as soon as the driver has it."""
    import ray
    from ray.exceptions import RayError

    task = ray.remote(num_cpus=1, max_retries=MAX_CELL_RETRIES, retry_exceptions=False)(evaluate)
    shared = ray.put(options)
    waiting = iter(cells)
    pending: dict[ray.ObjectRef[SweepRow], Cell] = {}

    def submit() -> None:
        while len(pending) < workers:
            cell = next(waiting, None)
            if cell is None:
                return
            pending[task.remote(cell, shared)] = cell

    submit()
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1)
        # Whatever else has finished by now joins the batch (one Parquet part); waiting for
        # more would leave a worker idle.
        rest = [r for r in pending if r not in ready]
        more, _ = ray.wait(rest, num_returns=len(rest), timeout=0) if rest else ([], [])
        rows: list[SweepRow] = []
        failure: SweepError | None = None
        for ref in [*ready, *more]:
            cell = pending.pop(ref)
            try:
                rows.append(ray.get(ref))
            except RayError as error:
                failure = failure or SweepError(f"sweep: cell {cell} failed: {error}")
        if rows:
            on_rows(rows)
        if failure is not None:
            raise failure
        submit()
