"""Entry point of the ``blueprinting`` command.

Subcommands register here by name with the module that implements them; a module is imported
only when its subcommand runs so that ``blueprinting --help`` starts fast. Each subcommand module
exposes ``add_arguments(parser)`` and ``run(args) -> int``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from blueprinting.errors import BlueprintingError, ConfigError, InvalidStrategyError

# name -> (module, one-line help). Keep alphabetical.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "calibrate": ("blueprinting.cli.calibrate", "fit a system's GEMM efficiency on measured runs"),
    "check": ("blueprinting.cli.check", "check a strategy file against every law"),
    "infer": (
        "blueprinting.cli.infer",
        "prefill, decode, throughput and memory of an inference (serving) strategy",
    ),
    "plan": ("blueprinting.cli.plan", "iteration time, breakdown, memory and MFU of a strategy"),
    "presets": ("blueprinting.cli.presets", "list built-in model and system presets"),
    "search": (
        "blueprinting.cli.search",
        "rank every legal strategy of a space by a model objective",
    ),
    "simulate": (
        "blueprinting.cli.simulate",
        "run a strategy's pipeline schedule; contract vs simulated bubble, traces, plots",
    ),
    "sweep": (
        "blueprinting.cli.sweep",
        "one search per cell of models x systems x GPU counts x batches, on Ray (resumable)",
    ),
    "validate": ("blueprinting.cli.validate", "compare predictions with published measured runs"),
}


def _build_parser(argv: Sequence[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="blueprinting",
        description="Plan Megatron-style parallel strategies for transformers.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        sub_parser = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            module = importlib.import_module(module_name)
            module.add_arguments(sub_parser)
            sub_parser.set_defaults(_module=module_name)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = _build_parser(args_list)
    args = parser.parse_args(args_list)
    module = importlib.import_module(args._module)
    try:
        code: int = module.run(args)
    except InvalidStrategyError as error:
        print(str(error), file=sys.stderr)
        return 1
    except ConfigError as error:
        print(str(error), file=sys.stderr)
        return 2
    except BlueprintingError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # A reader such as `head` closed the pipe: not an error of ours. Point stdout at devnull
        # so the interpreter's final flush does not raise again.
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return code


if __name__ == "__main__":
    raise SystemExit(main())
