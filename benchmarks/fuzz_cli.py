"""Fuzz every ``blueprinting`` command with many random cases and print figures (issue #18).

Run: ``.venv/bin/python benchmarks/fuzz_cli.py [--cases 100000] [--seed 0] [--workers 2]
[--forms toml,yaml] [--max-cpu-seconds 5] [--max-seconds 60]``. The cases are those of the
suite's fuzz test (``tests/fuzz/cli_cases.py``: flat keys, ``--set`` values, TOML, JSON and YAML
files, Hugging Face ``config.json``, the ``--explain`` strategy text, search and infer options,
published-runs fixtures, sweep files, ``--html`` output, ``presets``), run in process. Case
``i`` is drawn from its own ``random.Random(f"{seed}:{i}")``, so a run is the same cases
whatever ``--workers`` (worker ``k`` of ``N`` runs the cases ``i = k mod N``, in its own process
and scratch folder) and one case replays alone with ``--only i``. It prints cases per second,
the exit-status histogram (overall and per form), the slowest cases and their times, and every
case that escaped with an exception, exited outside {0, 1, 2}, exited non-zero without a
message, named a key both wrong and missing, or passed a time bound: ``--max-cpu-seconds`` of
this process's CPU time (the README's bound; CPU time, because the wall time of a machine shared
with other work says more about the other work) and ``--max-seconds`` of wall time; a case still
running after ``--abort-seconds`` is stopped and counted as a failure. Exit status 1 if any
failed.
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.fuzz.cli_cases import FORMS, Case, draw_case, problems_of, run_case


class CaseAbortedError(BaseException):
    """Raised in a case that ran past ``--abort-seconds`` (run_case reports it as a crash)."""


@dataclass(frozen=True, slots=True)
class Result:
    index: int
    form: str
    code: int
    seconds: float
    cpu_seconds: float
    text: str
    problems: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class _Job:
    seed: int
    forms: tuple[str, ...]
    max_seconds: float
    max_cpu_seconds: float
    abort_seconds: float


def case_of(seed: int, index: int, forms: tuple[str, ...]) -> Case:
    import random

    rng = random.Random(f"{seed}:{index}")
    return draw_case(rng, rng.choice(forms))


def _alarm(_signum: int, _frame: FrameType | None) -> None:
    raise CaseAbortedError


def _run_one(job: _Job, index: int, folder: Path) -> Result:
    case = case_of(job.seed, index, job.forms)
    signal.setitimer(signal.ITIMER_REAL, job.abort_seconds)
    try:
        outcome = run_case(case, folder)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    problems = problems_of(
        case, outcome, max_seconds=job.max_seconds, max_cpu_seconds=job.max_cpu_seconds
    )
    return Result(
        index,
        case.form,
        outcome.code,
        outcome.seconds,
        outcome.cpu_seconds,
        str(case),
        tuple(problems),
    )


def _worker(
    job: _Job, worker: int, workers: int, cases: int, queue: multiprocessing.Queue[Result | None]
) -> None:
    signal.signal(signal.SIGALRM, _alarm)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the parent's early stop ends a worker
    with tempfile.TemporaryDirectory(prefix=f"fuzz{worker}-") as scratch:
        for index in range(worker, cases, workers):
            queue.put(_run_one(job, index, Path(scratch)))
    queue.put(None)


def _results(job: _Job, cases: int, workers: int, only: int | None) -> Iterator[Result]:
    if only is not None:
        signal.signal(signal.SIGALRM, _alarm)
        with tempfile.TemporaryDirectory() as scratch:
            yield _run_one(job, only, Path(scratch))
        return
    context = multiprocessing.get_context("fork")
    queue: multiprocessing.Queue[Result | None] = context.Queue()
    processes = [
        context.Process(target=_worker, args=(job, k, workers, cases, queue), daemon=True)
        for k in range(workers)
    ]
    for process in processes:
        process.start()
    running = workers
    while running:
        item = queue.get()
        if item is None:
            running -= 1
        else:
            yield item
    for process in processes:
        process.join()


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--cases", type=int, default=100_000, help="cases to run (%(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (%(default)s)")
    parser.add_argument("--workers", type=int, default=1, help="processes (%(default)s)")
    parser.add_argument("--only", type=int, help="replay this one case index")
    parser.add_argument("--forms", default=",".join(FORMS), help="comma-separated input forms")
    parser.add_argument(
        "--max-seconds", type=float, default=60.0, help="wall-time bound of a case (%(default)s)"
    )
    parser.add_argument(
        "--max-cpu-seconds",
        type=float,
        default=5.0,
        help="CPU-time bound of a case, the README's (%(default)s)",
    )
    parser.add_argument(
        "--abort-seconds", type=float, default=120.0, help="stop a case after (%(default)s)"
    )
    parser.add_argument("--report-every", type=int, default=500, help="progress interval")
    args = parser.parse_args()
    forms = tuple(f for f in args.forms.split(",") if f)
    unknown = sorted(set(forms) - set(FORMS))
    if unknown or args.cases < 1 or args.workers < 1:
        parser.error(f"--forms must be among {', '.join(FORMS)}; --cases, --workers >= 1")
    job = _Job(args.seed, forms, args.max_seconds, args.max_cpu_seconds, args.abort_seconds)

    codes: collections.Counter[int] = collections.Counter()
    by_form: dict[str, collections.Counter[int]] = collections.defaultdict(collections.Counter)
    seconds_by_form: collections.Counter[str] = collections.Counter()
    cpu_by_form: collections.Counter[str] = collections.Counter()
    slowest: list[tuple[float, float, int, str]] = []
    failures: list[Result] = []
    done = 0
    start = time.perf_counter()
    stopped = False

    def stop(_signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    # SIGTERM (or ^C) ends the run early with the figures of the cases done.
    signal.signal(signal.SIGTERM, stop)
    try:
        for result in _results(job, args.cases, args.workers, args.only):
            done += 1
            codes[result.code] += 1
            by_form[result.form][result.code] += 1
            seconds_by_form[result.form] += result.seconds
            cpu_by_form[result.form] += result.cpu_seconds
            slowest = sorted(
                [*slowest, (result.cpu_seconds, result.seconds, result.index, result.text)],
                reverse=True,
            )[:10]
            if result.problems:
                failures.append(result)
                print(
                    f"FAIL case {result.index}: {result.text}\n  " + "\n  ".join(result.problems),
                    file=sys.stderr,
                    flush=True,
                )
            if done % args.report_every == 0:
                rate = done / (time.perf_counter() - start)
                print(f"  {done:,} cases, {rate:.1f}/s, {len(failures)} failing", flush=True)
    except KeyboardInterrupt:
        stopped = True
    elapsed = time.perf_counter() - start

    print(
        f"cases: {done:,}{' (stopped early)' if stopped else ''} in {elapsed:.1f} s with "
        f"{args.workers} worker(s): {done / elapsed:.1f} cases/s (seed {args.seed})"
    )
    print("exit status: " + ", ".join(f"{code}: {n:,}" for code, n in sorted(codes.items())))
    for form in sorted(by_form):
        histogram = ", ".join(f"{code}: {n}" for code, n in sorted(by_form[form].items()))
        total = sum(by_form[form].values())
        print(
            f"  {form:8} {total:7,} cases, mean {seconds_by_form[form] / total:.3f} s wall, "
            f"{cpu_by_form[form] / total:.3f} s CPU ({histogram})"
        )
    print("slowest (CPU):")
    for cpu, seconds, index, text in slowest:
        print(f"  {cpu:7.2f} s CPU {seconds:7.2f} s wall  case {index}: {text}")
    print(f"failing cases: {len(failures)}")
    for result in sorted(failures, key=lambda r: r.index)[:50]:
        print(f"case {result.index}: {result.text}\n  " + "\n  ".join(result.problems))
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
