"""``blueprinting check FILE``: read a strategy file and check it against every law.

Exit 0 with a one-line summary when every law holds, 1 listing every violation (raised as
:class:`InvalidStrategyError` and printed by ``cli/main.py``), 2 for a malformed file or an unknown
key (:class:`ConfigError`). Never a traceback for user input.
"""

from __future__ import annotations

import argparse

from blueprinting.errors import ConfigError, InvalidStrategyError
from blueprinting.mapping.config_file import ConfigFile, load_config
from blueprinting.mapping.laws import check_inference, check_training
from blueprinting.mapping.precision import AcceleratorSupport


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "file", metavar="FILE", nargs="?", help="strategy file (.toml, .json, .yaml)"
    )
    parser.add_argument("--model", help="model preset (without FILE, as plan takes it)")
    parser.add_argument("--system", help="system preset (without FILE)")
    parser.add_argument("--gpus", type=int, help="number of GPUs = world_size (without FILE)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a flat key (repeatable); model.preset=... and system.KEY=... address "
        "those sections",
    )
    parser.add_argument(
        "--no-megatron-rules",
        action="store_true",
        help="check only the planner's laws, not Megatron-LM's start-up rules",
    )


def _check_system(config: ConfigFile) -> AcceleratorSupport | None:
    """Validate the ``[system]`` section as ``plan`` and ``infer`` build it (every problem,
    an unknown preset with a did-you-mean), so ``check`` never passes a file they refuse; its
    accelerator, for the precision-recipe law (None: no system given)."""
    if config.system:
        from blueprinting.hardware.system_mapping import system_from_mapping

        return system_from_mapping(dict(config.system), source=config.source).accelerator.support
    return None


def summary(config: ConfigFile) -> str:
    """The one-line summary ``check`` prints for a lawful strategy."""
    if config.training is not None:
        mapping = config.training.mapping
        return (
            f"{config.training}  [world_size={mapping.world_size} "
            f"global_batch={mapping.batch.global_batch_size} "
            f"micro_batch={mapping.batch.micro_batch_size} "
            f"microbatches={mapping.microbatch_count}]"
        )
    if config.inference is not None:
        inference = config.inference.mapping
        workload = inference.workload
        return (
            f"{config.inference}  [world_size={inference.world_size} "
            f"batch={workload.batch_size} prompt={workload.prompt_length} "
            f"generated={workload.generated_tokens}]"
        )
    raise ConfigError(["the file holds neither a training nor an inference spec"])


def _run_without_file(args: argparse.Namespace, megatron: bool) -> int:
    """``check --model M --gpus N --set ...``: the spec ``plan`` would build, checked."""
    from blueprinting.cli.plan import load_training

    args.no_megatron_rules = not megatron
    spec, system = load_training(args)
    violations = check_training(
        spec.model, spec.mapping, megatron=megatron, accelerator=system.accelerator.support
    )
    if violations:
        raise InvalidStrategyError(violations, subject=str(spec))
    mapping = spec.mapping
    scope = "" if megatron else " (planner laws only)"
    print(
        f"ok: {spec}  [world_size={mapping.world_size} "
        f"global_batch={mapping.batch.global_batch_size} "
        f"micro_batch={mapping.batch.micro_batch_size} "
        f"microbatches={mapping.microbatch_count}]{scope}"
    )
    return 0


def run(args: argparse.Namespace) -> int:
    overrides: list[str] = list(args.overrides)
    megatron = not bool(args.no_megatron_rules)
    if args.file is None:
        return _run_without_file(args, megatron)
    if args.model is not None or args.gpus is not None:
        raise ConfigError(["give either FILE or --model/--gpus, not both"])
    config = load_config(str(args.file), overrides=overrides)
    accelerator = _check_system(config)
    if config.training is not None:
        spec_text = str(config.training)
        violations = check_training(
            config.training.model,
            config.training.mapping,
            megatron=megatron,
            accelerator=accelerator,
        )
    elif config.inference is not None:
        spec_text = str(config.inference)
        violations = check_inference(
            config.inference.model, config.inference.mapping, megatron=megatron
        )
    else:
        raise ConfigError(["the file holds neither a training nor an inference spec"])
    if violations:
        raise InvalidStrategyError(violations, subject=spec_text)
    scope = "" if megatron else " (planner laws only)"
    print(f"ok: {summary(config)}{scope}")
    return 0
