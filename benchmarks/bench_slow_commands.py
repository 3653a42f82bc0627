"""Time the README's slowest commands (its time-bound table, issue 18) and check their output.

Run: ``OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_slow_commands.py [--save FILE]
[--compare FILE] [--only NAME ...]``. Each command runs as its own process (start-up included,
as the README's bound counts it); the script prints its CPU seconds (user + system, the figure
the README's table gives: a shared machine's wall time measures the other work) and the SHA-256
of what it wrote (stdout, and the ``--csv`` file where it writes one). ``--save`` writes the
digests as JSON; ``--compare`` exits 1 when one differs from a saved file's, so a speed change
made on one checkout is checked byte for byte against the output of another (run ``--save`` on
the base commit first).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SERVING = str(ROOT / "examples" / "llama2-70b-h100-serving.toml")

#: name -> arguments of ``blueprinting``; ``{csv}`` is replaced by a scratch file's path.
COMMANDS: dict[str, tuple[str, ...]] = {
    "infer-generated-100000": (
        "infer", SERVING, "--search", "--set", "generated_tokens=100000", "--json",
    ),
    "infer-replicas-100000": ("infer", SERVING, "--search", "--set", "replicas=100000", "--json"),
    # The fuzz run's slowest infer case (seed 1202, case 24863).
    "infer-generated-3977": (
        "infer", SERVING, "--search", "--set", "generated_tokens=3977", "--json",
    ),
    # The fuzz run's slowest search (seed 1202, case 20198): 3,003 block configurations.
    "search-deepseek-v2-lite-512": (
        "search", "--model", "deepseek-v2-lite", "--gpus", "512", "--global-batch", "128",
        "--memory-headroom-gib", "0", "--context-parallel", "auto", "--csv", "{csv}",
    ),
    "search-mixtral-32": (
        "search", "--model", "mixtral-8x7b", "--gpus", "32", "--global-batch", "256",
        "--context-parallel", "auto", "--expert-parallel", "auto", "--csv", "{csv}",
    ),
    # DeepSeek-V3 over every cp degree and comm type: 6,858 block configurations, streamed
    # (limits.SEARCH_BLOCKS_WITHIN_BOUND; the fuzz run's slowest search of seed 1272 was its
    # sibling over --gpus 4 343 1024).
    "search-deepseek-v3-1024": (
        "search", "--model", "deepseek-v3", "--gpus", "1024", "--global-batch", "1024",
        "--context-parallel", "auto", "--csv", "{csv}",
    ),
    # The candidates term of the bound (limits.SEARCH_SECONDS_PER_CANDIDATE): 113,214 lawful
    # Qwen3-30B-A3B candidates over 1,287 block configurations (fuzz seed 1304 case 78049), and
    # a dense space over one and two GPU counts, the same 282 block configurations.
    "search-qwen3-30b-a3b-4-1536": (
        "search", "--model", "qwen3-30b-a3b", "--gpus", "4", "1536", "--global-batch", "2382",
        "--max-micro-batch", "4", "--tp-comm-overlap", "off", "--context-parallel", "auto",
    ),
    # A plain MoE search at the block bound (limits.SEARCH_BLOCKS_WITHIN_BOUND): 1,008 block
    # configurations and 63,192 candidates (fuzz seed 1307 case 33155 adds an unlawful count).
    "search-gpt-oss-20b-64": (
        "search", "--model", "gpt-oss-20b", "--gpus", "64", "1083", "--global-batch", "3276",
    ),
    "search-gpt3-175b-1024": (
        "search", "--model", "gpt3-175b", "--gpus", "1024", "--global-batch", "1536",
    ),
    "search-gpt3-175b-1024-2048": (
        "search", "--model", "gpt3-175b", "--gpus", "1024", "2048", "--global-batch", "1536",
    ),
}  # fmt: skip


def run(name: str, args: tuple[str, ...], folder: Path) -> tuple[float, str]:
    """(CPU seconds of the command's process, SHA-256 of its stdout and CSV file)."""
    csv = folder / f"{name}.csv"
    argv = [a.replace("{csv}", str(csv)) for a in args]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(
        [sys.executable, "-m", "blueprinting", *argv],
        capture_output=True,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    digest = hashlib.sha256(done.stdout)
    digest.update(f"exit {done.returncode}".encode())
    if csv.exists():
        digest.update(csv.read_bytes())
    return cpu, digest.hexdigest()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--save", type=Path, help="write the output digests to this JSON file")
    parser.add_argument("--compare", type=Path, help="exit 1 if a digest differs from this file's")
    parser.add_argument("--only", nargs="+", choices=sorted(COMMANDS), help="run these alone")
    options = parser.parse_args()
    expected = json.loads(options.compare.read_text()) if options.compare else {}
    digests: dict[str, str] = {}
    differ = []
    with tempfile.TemporaryDirectory() as scratch:
        for name, args in COMMANDS.items():
            if options.only and name not in options.only:
                continue
            cpu, digests[name] = run(name, args, Path(scratch))
            same = ""
            if name in expected:
                same = "  output same" if expected[name] == digests[name] else "  OUTPUT DIFFERS"
                if expected[name] != digests[name]:
                    differ.append(name)
            print(f"{name:30s} {cpu:6.2f} s CPU{same}", flush=True)
    if options.save:
        options.save.write_text(json.dumps(digests, indent=2) + "\n")
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
