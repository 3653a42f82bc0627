"""``blueprinting calibrate``: fit a system's achieved-GEMM fraction on measured runs.

Fits ``peak_fraction`` of the system preset's GEMM efficiency on a named subset of a table of
measured runs (default: the published fixture, subset Korthikanti et al. 2022 Table 4), prints
the error on the fit subset and, separately, on every held-out table, and the ``[system]``
override to paste into a config file (:mod:`blueprinting.validation.calibration`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from blueprinting.validation.published import SourceTable


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--fixture",
        type=Path,
        default=None,
        help="measured runs in the published-runs TOML format (default: the published fixture)",
    )
    parser.add_argument("--system", default="dgx-a100-80gb", help="system preset to calibrate")
    parser.add_argument(
        "--fit",
        action="append",
        choices=[source.value for source in SourceTable],
        help="source table to fit on (repeatable; default: korthikanti2022_table4)",
    )


def run(args: argparse.Namespace) -> int:
    from blueprinting.hardware.presets import system_preset
    from blueprinting.validation.calibration import fit_gemm_peak_fraction, override_toml
    from blueprinting.validation.published import load_published_runs

    tables = frozenset(SourceTable(name) for name in (args.fit or ["korthikanti2022_table4"]))
    runs = load_published_runs(args.fixture)
    result = fit_gemm_peak_fraction(system_preset(args.system), runs, fit_tables=tables)
    print(f"system {args.system}: GEMM peak_fraction = {result.peak_fraction:g}")
    fit = result.fit
    print(
        f"fit on {', '.join(sorted(tables))}: {fit.count} figures, "
        f"MAE {100 * fit.mae:.1f}%, max {100 * fit.max_error:.1f}%"
    )
    for source, summary in sorted(result.held_out.items()):
        print(
            f"held out {source}: {summary.count} figures, "
            f"MAE {100 * summary.mae:.1f}%, max {100 * summary.max_error:.1f}%"
        )
    print()
    print(override_toml(result, args.system))
    return 0
