"""``blueprinting calibrate``: fit a system's efficiencies on measured runs or on
microbenchmarks.

Without ``--gemm`` / ``--nccl`` / ``--stream``: fits ``peak_fraction`` of the system preset's GEMM
efficiency on a named subset of a table of measured runs (default: the published fixture, subset
Korthikanti et al. 2022 Table 4), prints the error on the fit subset and, separately, on every
held-out table, and the ``[system]`` override to paste into a config file
(:mod:`blueprinting.validation.calibration`).

With any of them: ``blueprinting calibrate --gemm FILE --nccl FILE --stream FILE [--system
PRESET] [--out system.toml]`` fits the GEMM shape model, the links and the HBM fraction on a
user's own GEMM sweep CSV, nccl-tests outputs and BabelStream output
(:mod:`blueprinting.hardware.measurement_files`, :mod:`blueprinting.hardware.measured_system`),
prints the fit error per input and writes the ``[system]`` section (to ``--out``, else stdout),
which ``--system FILE`` or a config file's ``[system]`` accepts.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from blueprinting.errors import ConfigError
from blueprinting.validation.published import SourceTable

_NCCL_OPS = {
    "all_reduce": "all_reduce",
    "all_gather": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "alltoall": "all_to_all",
}


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
    measured = parser.add_argument_group("calibration from microbenchmarks")
    measured.add_argument(
        "--gemm", type=Path, metavar="FILE", help="GEMM sweep CSV: M, N, K, dtype, TFLOP/s"
    )
    measured.add_argument(
        "--nccl",
        type=Path,
        action="append",
        metavar="FILE",
        help="nccl-tests output (all_reduce / all_gather / reduce_scatter / alltoall; repeatable)",
    )
    measured.add_argument(
        "--nccl-scope",
        choices=["intra", "inter"],
        help="the link the --nccl files measured (default: detected, one host = intra)",
    )
    measured.add_argument(
        "--nccl-op",
        choices=["all_reduce", "all_gather", "reduce_scatter", "alltoall"],
        help="the op of --nccl files that do not name it (nccl-tests before 2.13)",
    )
    measured.add_argument("--stream", type=Path, metavar="FILE", help="BabelStream output")
    measured.add_argument(
        "--out", type=Path, metavar="FILE", help="write the [system] section here (else stdout)"
    )


def run(args: argparse.Namespace) -> int:
    if args.gemm is not None or args.nccl or args.stream is not None:
        return _run_measured(args)
    if args.out is not None or args.nccl_scope is not None or args.nccl_op is not None:
        raise ConfigError(["--out, --nccl-scope and --nccl-op need --gemm, --nccl or --stream"])
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


def _run_measured(args: argparse.Namespace) -> int:
    from blueprinting.hardware.collectives import CollectiveKind
    from blueprinting.hardware.measured_system import NcclInput, calibrate_measured
    from blueprinting.hardware.measurement_files import (
        LinkScope,
        read_babelstream,
        read_gemm_csv,
        read_nccl_tests,
    )
    from blueprinting.hardware.presets import system_preset

    if args.fixture is not None or args.fit:
        raise ConfigError(
            [
                "--fixture / --fit calibrate on measured runs; --gemm / --nccl / --stream on "
                "microbenchmarks: give one kind"
            ]
        )
    system = system_preset(args.system)
    op = None if args.nccl_op is None else CollectiveKind(_NCCL_OPS[args.nccl_op])
    nccl = []
    for path in args.nccl or []:
        run = read_nccl_tests(path, op)
        scope = run.detected_scope if args.nccl_scope is None else LinkScope(args.nccl_scope)
        nccl.append(NcclInput(path=path, run=run, scope=scope))
    result = calibrate_measured(
        system,
        args.system,
        gemm=None if args.gemm is None else read_gemm_csv(args.gemm),
        gemm_source=str(args.gemm),
        nccl=nccl,
        stream=None if args.stream is None else read_babelstream(args.stream),
        stream_source=str(args.stream),
    )
    print(f"system {args.system}, calibrated on microbenchmarks:")
    print(result.report())
    text = result.toml()
    if args.out is None:
        print()
        print(text, end="")
        return 0
    try:
        args.out.write_text(text, encoding="utf-8")
    except OSError as error:
        raise ConfigError([f"cannot write {args.out}: {error.strerror or error}"]) from None
    print(f"wrote {args.out} (pass it as --system {args.out}, or paste it into a config file)")
    return 0
