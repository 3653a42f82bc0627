"""Fuzz every ``blueprinting`` command with many random cases and print figures (issue #18).

Run: ``.venv/bin/python benchmarks/fuzz_cli.py [--cases 100000] [--seed 0] [--forms toml,yaml]
[--max-seconds 15]``. The cases are those of the suite's fuzz test (``tests/fuzz/cli_cases.py``:
flat keys, ``--set`` values, TOML, JSON and YAML files, Hugging Face ``config.json``, the
``--explain`` strategy text, search and infer options, published-runs fixtures), run in this
process. It prints cases per second, the exit-status histogram (overall and per form), the slowest
cases and their times, and every case that escaped with an exception, exited outside {0, 1, 2},
exited non-zero without a message or passed the time bound. Exit status 1 if any did.
"""

from __future__ import annotations

import argparse
import collections
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.fuzz.cli_cases import FORMS, draw_case, problems_of, run_case


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=100_000, help="cases to run (%(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (%(default)s)")
    parser.add_argument("--forms", default=",".join(FORMS), help="comma-separated input forms")
    parser.add_argument(
        "--max-seconds", type=float, default=15.0, help="time bound of one case (%(default)s)"
    )
    parser.add_argument("--report-every", type=int, default=500, help="progress interval")
    args = parser.parse_args()
    forms = [f for f in args.forms.split(",") if f]
    unknown = sorted(set(forms) - set(FORMS))
    if unknown or args.cases < 1:
        parser.error(f"--forms must be among {', '.join(FORMS)} and --cases >= 1")

    rng = random.Random(args.seed)
    codes: collections.Counter[int] = collections.Counter()
    by_form: dict[str, collections.Counter[int]] = collections.defaultdict(collections.Counter)
    seconds_by_form: collections.Counter[str] = collections.Counter()
    slowest: list[tuple[float, str]] = []
    failures: list[str] = []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        for i in range(args.cases):
            case = draw_case(rng, rng.choice(forms))
            outcome = run_case(case, folder)
            codes[outcome.code] += 1
            by_form[case.form][outcome.code] += 1
            seconds_by_form[case.form] += outcome.seconds
            slowest.append((outcome.seconds, str(case)))
            slowest = sorted(slowest, reverse=True)[:5]
            problems = problems_of(case, outcome, max_seconds=args.max_seconds)
            if problems:
                failures.append(f"case {i}: {case}\n  " + "\n  ".join(problems))
            if (i + 1) % args.report_every == 0:
                rate = (i + 1) / (time.perf_counter() - start)
                print(f"  {i + 1:,} cases, {rate:.1f}/s, {len(failures)} failing", file=sys.stderr)
    elapsed = time.perf_counter() - start

    print(f"cases: {args.cases:,} in {elapsed:.1f} s: {args.cases / elapsed:.1f} cases/s")
    print("exit status: " + ", ".join(f"{code}: {n:,}" for code, n in sorted(codes.items())))
    for form in sorted(by_form):
        histogram = ", ".join(f"{code}: {n}" for code, n in sorted(by_form[form].items()))
        total = sum(by_form[form].values())
        print(
            f"  {form:8} {total:7,} cases, mean {seconds_by_form[form] / total:.3f} s ({histogram})"
        )
    print("slowest:")
    for seconds, text in slowest:
        print(f"  {seconds:7.2f} s  {text}")
    print(f"failing cases: {len(failures)}")
    for text in failures[:20]:
        print(text)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
