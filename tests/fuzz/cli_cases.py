"""Random command lines and input files for every ``blueprinting`` command, and an in-process
runner that records what each one did.

A case is drawn from a ``random.Random``: the suite's fuzz test passes hypothesis's
(``st.randoms()``, so failures shrink and replay), ``benchmarks/fuzz_cli.py`` a seeded one.
The forms covered: flat keys (``--model/--gpus --set``), ``--set`` values over a file, TOML,
JSON and YAML strategy files (alias bombs and self-references among them), a Hugging Face
``config.json`` behind ``hf_config``, the ``--explain`` strategy text, search and infer options,
and published-runs fixtures for ``validate`` and ``calibrate``. Values lean on the edges: 0,
negatives, 2**63 - 1 and just beyond, numbers with many divisors, NaN and infinities, wrong
types, unknown and misspelled keys, truncated and garbled text.

:func:`run_case` calls ``blueprinting.cli.main.main`` with the case's argv (files written to a
folder first) and returns the exit status, the output and the wall time; an exception other than
argparse's ``SystemExit`` is returned as its traceback, never raised.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import math
import random
import re
import sys
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest

from blueprinting.mapping.flat_keys import (
    CONTEXT_KEYS,
    EXPERT_KEYS,
    INFERENCE_KEYS,
    MODEL_KEYS,
    SHARED_KEYS,
    TRAINING_KEYS,
)
from blueprinting.search.strategy_text import _KEYS as _STRATEGY_KEYS

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
TRAINING_FILES = ("gpt3-175b-selene.toml", "llama2-70b-h100.toml")
SERVING_FILE = "llama2-70b-h100-serving.toml"
FIXTURES = REPO / "tests" / "validation" / "fixtures"
#: validate's fixture flags and the fixtures they read by default
VALIDATE_FIXTURES = {
    "--fixture": "published_runs.toml",
    "--memory-fixture": "measured_memory.toml",
    "--modern-fixture": "modern_runs.toml",
    "--moe-fixture": "modern_moe_runs.toml",
}

COMMANDS = (
    "calibrate",
    "check",
    "infer",
    "plan",
    "presets",
    "search",
    "simulate",
    "sweep",
    "validate",
)
FORMS = (
    "flat",
    "set",
    "toml",
    "json",
    "yaml",
    "hf",
    "explain",
    "search",
    "infer",
    "fixture",
    "sweep",
    "html",
    "presets",
)

DENSE_PRESETS = ("gpt3-175b", "gpt-1.7b", "llama2-7b", "llama2-70b", "llama3-8b", "megatron-1t")
MOE_PRESETS = ("mixtral-8x7b", "deepseek-v2-lite", "deepseek-v3", "qwen3-30b-a3b", "gpt-oss-20b")
MODEL_PRESETS = DENSE_PRESETS + MOE_PRESETS
SYSTEM_PRESETS = ("dgx-a100-80gb", "dgx-h100", "dgx-b200", "mi300x-8", "dgx-a100-40gb")
TRAINING_NAMES = (
    tuple(TRAINING_KEYS) + tuple(SHARED_KEYS) + tuple(CONTEXT_KEYS) + tuple(EXPERT_KEYS)
)
INFERENCE_NAMES = tuple(INFERENCE_KEYS) + tuple(SHARED_KEYS)
MODEL_NAMES = tuple(MODEL_KEYS)
SYSTEM_NAMES = (
    "preset",
    "gpus_per_node",
    "accelerator.hbm.capacity_bytes",
    "accelerator.hbm.bandwidth_bytes_per_s",
    "network.intra.bandwidth_bytes_per_s",
    "nodes",
)
INT_EDGES = (
    0,
    1,
    2,
    3,
    4,
    5,
    7,
    8,
    12,
    16,
    64,
    96,
    128,
    1024,
    1536,
    -1,
    -8,
    2**31 - 1,
    2**32,
    2**40,
    2**62,
    2**63 - 1,
    2**63,
    2**64,
    10**12,
    99_999_999_999,
    9_316_358_251_200,  # 10,752 divisors
    10**30,
)
FLOAT_EDGES = (0.0, -0.0, 0.5, 1.0, 1.5, -1.0, 1e-300, 1e308, float("inf"), float("-inf"))
TEXT_EDGES = (
    "",
    " ",
    "true",
    "false",
    "none",
    "auto",
    "selective",
    "full",
    "uniform",
    "block",
    "optim_grads",
    "1f1b",
    "zb-h1",
    "bfloat16",
    "float8",
    "RMSNorm",
    "rope",
    "nan",
    "inf",
    "-inf",
    "1e400",
    "0x10",
    "1_000",
    "9" * 5000,
    "é",
    "\u202e",
    "a=b",
    "[1, 2]",
    "{}",
)
# the keys the --explain parser accepts (search/strategy_text.py), and no hand-kept copy
STRATEGY_WORDS = _STRATEGY_KEYS
HF_BASE: dict[str, object] = {
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "hidden_act": "silu",
}


@dataclass(frozen=True, slots=True)
class Case:
    """One command line; ``{dir}`` in an argument is the folder ``files`` are written to."""

    form: str
    argv: tuple[str, ...]
    files: tuple[tuple[str, str], ...] = ()

    @property
    def command(self) -> str:
        return self.argv[0]

    def __str__(self) -> str:
        shown = " ".join(a if len(a) <= 80 else a[:77] + "..." for a in self.argv)
        names = ", ".join(f"{name} ({len(text)} chars)" for name, text in self.files)
        return f"[{self.form}] blueprinting {shown}" + (f"  files: {names}" if names else "")


@dataclass(frozen=True, slots=True)
class Outcome:
    code: int
    out: str
    err: str
    seconds: float
    crash: str | None  # the traceback of an exception that escaped main()
    cpu_seconds: float = 0.0  # this process's CPU time during the case (load-independent)


# --------------------------------------------------------------------------------------------
# Values
# --------------------------------------------------------------------------------------------
def _int(rng: random.Random) -> int:
    roll = rng.random()
    if roll < 0.4:
        return rng.choice(INT_EDGES)
    if roll < 0.6:
        return int(2 ** rng.randint(0, 12))
    if roll < 0.85:
        return rng.randint(1, 4096)
    return rng.randint(1, 2**63 - 1)


def _text(rng: random.Random) -> str:
    if rng.random() < 0.7:
        return rng.choice(TEXT_EDGES)
    alphabet = "abcxyz019_-.=/ \t\"'[]{}#\\é\u0000\u2028"
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))


def _scalar(rng: random.Random) -> object:
    """A document value: mostly integers, then floats, booleans and text."""
    roll = rng.random()
    if roll < 0.7:
        return _int(rng)
    if roll < 0.77:
        return rng.choice(FLOAT_EDGES)
    if roll < 0.85:
        return rng.random() < 0.5
    if roll < 0.97:
        return _text(rng)
    return [_int(rng)] if rng.random() < 0.5 else {"k": _int(rng)}


def _set_value(rng: random.Random) -> str:
    """A ``--set`` value as typed on a command line."""
    roll = rng.random()
    if roll < 0.75:
        return str(_int(rng))
    if roll < 0.82:
        return repr(rng.choice(FLOAT_EDGES))
    return _text(rng)


_KINDS = {
    **TRAINING_KEYS,
    **SHARED_KEYS,
    **CONTEXT_KEYS,
    **EXPERT_KEYS,
    **INFERENCE_KEYS,
    **MODEL_KEYS,
}
_LIST_WORDS = ("p2p", "a2a", "all_gather", "a2a+p2p", "2", "4", "8", "x")
_LAYOUT_TOKENS = ("E", "L", "t", "m", "t*2", "t*3", "t*12", "t*95", "t*0", "t*-1", "E,t", "x", "")


def layout_text(rng: random.Random) -> str:
    """A ``pipeline_model_parallel_layout`` string (Megatron-LM's ``Et*3|t*3|tmL`` form),
    mostly well-formed, sometimes garbled or huge."""
    roll = rng.random()
    if roll < 0.05:
        return "t|" * rng.choice((1024, 4096, 100_000))
    if roll < 0.1:
        return "t*" + str(_int(rng))
    stages = []
    for _ in range(rng.randint(1, 8)):
        stages.append("".join(rng.choice(_LAYOUT_TOKENS) for _ in range(rng.randint(1, 4))))
    stages[0] = "E" + stages[0] if rng.random() < 0.7 else stages[0]
    stages[-1] = stages[-1] + "L" if rng.random() < 0.7 else stages[-1]
    return rng.choice(("|", "|", ",", " | ")).join(stages)


def _typed(rng: random.Random, key: str) -> object:
    """Mostly a value of the key's own type (so that cases reach past parsing), else anything."""
    spec = _KINDS.get(key)
    if spec is None or rng.random() < 0.08:
        return _scalar(rng)
    kind = spec.kind.name
    if key == "pipeline_model_parallel_layout":
        return layout_text(rng)
    if kind == "LIST":
        return " ".join(rng.choice(_LIST_WORDS) for _ in range(rng.randint(0, 3)))
    if kind == "INT":
        return rng.choice((1, 1, 2, 4, 8, 16, 96, 2 ** rng.randint(0, 14), _int(rng)))
    if kind == "BOOL":
        return rng.random() < 0.5
    if spec.choices:
        return rng.choice(spec.choices)
    if kind == "FP8":
        return rng.choice((True, False, "e4m3", "hybrid"))
    if kind == "FP4":
        return rng.choice((True, False, "e2m1", "e3m2"))
    if kind == "NUMBER":
        return rng.choice((0.5, 1.0, 1.25, 2.0, 0.001, _int(rng), *FLOAT_EDGES))
    if kind == "COUNT":
        return rng.choice((0, 1, 2, 3, _int(rng)))
    if kind == "LAYER_FREQ":
        return rng.choice((1, 2, "([0]*3+[1]*58)", "[0,1,1]", "([1]*10**9)", "[2]", "([0]*", 0))
    return _text(rng)


def _typed_text(rng: random.Random, key: str) -> str:
    value = _typed(rng, key.removeprefix("model."))
    if isinstance(value, bool):
        return "true" if value else "false"
    return (
        value if isinstance(value, str) else repr(value) if isinstance(value, float) else str(value)
    )


def _key(rng: random.Random, names: tuple[str, ...]) -> str:
    key = rng.choice(names)
    roll = rng.random()
    if roll < 0.06:
        return key.replace("_", "-")
    if roll < 0.09:
        return "--" + key.replace("_", "-")
    if roll < 0.12 and len(key) > 3:  # a typo
        i = rng.randrange(len(key))
        return key[:i] + key[i + 1 :]
    if roll < 0.13:
        return _text(rng) or "x"
    return key


# --------------------------------------------------------------------------------------------
# Documents
# --------------------------------------------------------------------------------------------
def _section(
    rng: random.Random, names: tuple[str, ...], base: dict[str, object]
) -> dict[str, object]:
    out = dict(base)
    if rng.random() < 0.2:
        for key in rng.sample(list(out), k=rng.randint(1, min(2, len(out)))):
            del out[key]
    for _ in range(rng.choice((0, 1, 1, 1, 2, 3))):
        key = _key(rng, names)
        out[key] = _typed(rng, key)
    return out


_TRAINING_BASE: dict[str, object] = {
    "tensor_model_parallel_size": 8,
    "pipeline_model_parallel_size": 8,
    "world_size": 1024,
    "micro_batch_size": 1,
    "global_batch_size": 1536,
}
_INFERENCE_BASE: dict[str, object] = {
    "tensor_model_parallel_size": 8,
    "pipeline_model_parallel_size": 1,
    "replicas": 1,
    "batch_size": 16,
    "prompt_length": 2048,
    "generated_tokens": 256,
}


def _document(rng: random.Random) -> dict[str, object]:
    """A strategy document: [model], [training] or [inference], [system], perturbed."""
    inference = rng.random() < 0.4
    doc: dict[str, object] = {}
    model = _section(rng, MODEL_NAMES, {"preset": rng.choice(MODEL_PRESETS)})
    doc["model"] = model
    if inference:
        doc["inference"] = _section(rng, INFERENCE_NAMES, _INFERENCE_BASE)
    else:
        doc["training"] = _section(rng, TRAINING_NAMES, _TRAINING_BASE)
    doc["system"] = {"preset": rng.choice(SYSTEM_PRESETS)}
    roll = rng.random()
    if roll < 0.03:
        doc["training" if inference else "inference"] = {"batch_size": 1}
    elif roll < 0.06:
        doc[_text(rng) or "extra"] = {"a": 1}
    elif roll < 0.09:
        del doc["system"]
    elif roll < 0.12:
        doc["model"] = _scalar(rng)
    return doc


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if value in (float("inf"), float("-inf")):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return (
            "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in value.items()) + "}"
        )
    return json.dumps(str(value))


def to_toml(doc: dict[str, object]) -> str:
    lines: list[str] = []
    for name, section in doc.items():
        if isinstance(section, dict):
            lines.append(f"[{json.dumps(name)}]")
            lines.extend(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in section.items())
        else:
            lines.insert(0, f"{json.dumps(name)} = {_toml_value(section)}")
    return "\n".join(lines) + "\n"


def _garble(rng: random.Random, text: str) -> str:
    """Sometimes truncate the text or splice junk into it."""
    roll = rng.random()
    if roll < 0.06 and text:
        return text[: rng.randrange(len(text))]
    if roll < 0.12:
        i = rng.randrange(len(text) + 1)
        return (
            text[:i]
            + rng.choice(("[", "]", "{", '"', "=", "\n[[x]]\n", "\x00", "*a", "&a"))
            + text[i:]
        )
    return text


def alias_bomb(levels: int = 9, width: int = 9) -> str:
    """A "billion laughs" YAML: ``width ** levels`` strings from a few hundred bytes."""
    lines = ['l0: &l0 ["lol"]']
    for level in range(1, levels + 1):
        refs = ", ".join(f"*l{level - 1}" for _ in range(width))
        lines.append(f"l{level}: &l{level} [{refs}]")
    lines.append(f"model: {{preset: *l{levels}}}")
    lines.append("training: {tensor_model_parallel_size: *l" + str(levels) + "}")
    return "\n".join(lines) + "\n"


def _yaml(rng: random.Random, doc: dict[str, object]) -> str:
    import yaml

    roll = rng.random()
    if roll < 0.1:
        return alias_bomb(rng.randint(3, 12), rng.randint(2, 12))
    if roll < 0.15:
        return "a: &a [*a]\nmodel: {preset: gpt3-175b}\n"
    if roll < 0.2:
        return "model: !!python/object/apply:os.system ['echo pwned']\n"
    text = yaml.safe_dump(json.loads(json.dumps(doc, allow_nan=True)), allow_unicode=True)
    return _garble(rng, text)


# --------------------------------------------------------------------------------------------
# Forms
# --------------------------------------------------------------------------------------------
def _plan_flags(rng: random.Random) -> list[str]:
    flags: list[str] = []
    for flag in ("--json", "--no-simulate", "--all-stages", "--no-megatron-rules"):
        if rng.random() < 0.25:
            flags.append(flag)
    if rng.random() < 0.2:
        flags += ["--bubble", rng.choice(("contract", "simulated"))]
    if rng.random() < 0.15:
        flags += ["--flops-convention", rng.choice(("megatron-legacy", "6nd", "6nd-attn"))]
    if rng.random() < 0.15:
        flags += ["--train-tokens", str(_int(rng))]
    if rng.random() < 0.1:
        flags += ["--system", rng.choice((*SYSTEM_PRESETS, "nope"))]
    return flags


def _sets(rng: random.Random, names: tuple[str, ...], count: int) -> list[str]:
    out: list[str] = []
    for _ in range(count):
        roll = rng.random()
        if roll < 0.15:
            key = "model." + _key(rng, (*MODEL_NAMES, "preset"))
        elif roll < 0.25:
            key = "system." + rng.choice(SYSTEM_NAMES)
        else:
            key = _key(rng, names)
        value = _typed_text(rng, key) if rng.random() < 0.92 else _set_value(rng)
        item = f"{key}={value}" if rng.random() < 0.97 else _text(rng)
        out += ["--set", item]
    return out


def _flat(rng: random.Random) -> Case:
    command = rng.choice(("plan", "simulate"))
    argv = [command, "--model", rng.choice((*MODEL_PRESETS, "gpt-4"))]
    argv += ["--gpus", str(_int(rng))]
    argv += _sets(rng, TRAINING_NAMES + MODEL_NAMES, rng.randint(0, 5))
    return Case("flat", (*argv, *_plan_flags(rng)))


def _set(rng: random.Random) -> Case:
    command = rng.choice(("check", "plan", "simulate", "infer"))
    serving = command == "infer" if rng.random() < 0.9 else command != "infer"
    file = SERVING_FILE if serving else rng.choice(TRAINING_FILES)
    names = INFERENCE_NAMES if serving else TRAINING_NAMES
    argv = [command, str(EXAMPLES / file), *_sets(rng, names + MODEL_NAMES, rng.randint(1, 4))]
    if command in ("plan", "simulate"):
        argv += _plan_flags(rng)
    elif command == "check" and rng.random() < 0.3:
        argv.append("--no-megatron-rules")
    elif command == "infer" and rng.random() < 0.3:
        argv.append("--json")
    return Case("set", tuple(argv))


def _file_case(rng: random.Random, form: str, name: str, text: str, inference: bool) -> Case:
    if inference:
        command = "infer" if rng.random() < 0.8 else "check"
    else:
        command = rng.choice(("check", "plan", "simulate", "infer"))
    argv = [command, "{dir}/" + name]
    if command in ("plan", "simulate"):
        argv += _plan_flags(rng)
    if rng.random() < 0.2:
        argv += _sets(rng, INFERENCE_NAMES if inference else TRAINING_NAMES, 1)
    return Case(form, tuple(argv), ((name, text),))


def _toml(rng: random.Random) -> Case:
    doc = _document(rng)
    return _file_case(rng, "toml", "s.toml", _garble(rng, to_toml(doc)), "inference" in doc)


def _json(rng: random.Random) -> Case:
    doc = _document(rng)
    text = json.dumps(doc, allow_nan=True) if rng.random() < 0.95 else "[" * rng.randint(1, 200000)
    return _file_case(rng, "json", "s.json", _garble(rng, text), "inference" in doc)


def _yaml_case(rng: random.Random) -> Case:
    doc = _document(rng)
    name = rng.choice(("s.yaml", "s.yml"))
    return _file_case(rng, "yaml", name, _yaml(rng, doc), "inference" in doc)


def _hf(rng: random.Random) -> Case:
    config = dict(HF_BASE)
    if rng.random() < 0.15:
        for key in rng.sample(list(config), k=rng.randint(1, 2)):
            del config[key]
    for _ in range(rng.choice((0, 1, 1, 2))):
        key = rng.choice((*HF_BASE, "head_dim", "attention_bias", "mlp_bias", "name"))
        base = HF_BASE.get(key, 128)
        if rng.random() < 0.7 and isinstance(base, int) and not isinstance(base, bool):
            config[key] = rng.choice((1, 2, 8, 64, 128, 4096, 2**20, _int(rng)))
        else:
            config[key] = _scalar(rng)
    config_text = json.dumps(config, allow_nan=True)
    inference = rng.random() < 0.5
    section = _INFERENCE_BASE if inference else _TRAINING_BASE
    doc = {
        "model": {"hf_config": "config.json"},
        "inference" if inference else "training": _section(
            rng, INFERENCE_NAMES if inference else TRAINING_NAMES, section
        ),
        "system": {"preset": rng.choice(SYSTEM_PRESETS)},
    }
    case = _file_case(rng, "hf", "s.toml", to_toml(doc), inference)
    return Case("hf", case.argv, (*case.files, ("config.json", _garble(rng, config_text))))


def _search_argv(rng: random.Random, *, small: bool) -> list[str]:
    small_models = ("gpt-1.7b", "llama2-7b", "gpt3-175b", "mixtral-8x7b", "deepseek-v2-lite")
    model = rng.choice(small_models if small else (*MODEL_PRESETS, "x"))
    if small:
        gpus = [str(rng.choice((8, 16, 32, 64)))]
        batch = str(rng.choice((8, 16, 32, 64)))
    else:
        gpus = [str(_int(rng)) for _ in range(rng.randint(1, 3))]
        batch = str(_int(rng))
    argv = ["search", "--model", model, "--gpus", *gpus, "--global-batch", batch]
    if rng.random() < 0.5:
        argv += ["--json"] if rng.random() < 0.5 else ["--csv", rng.choice(_CSV_TARGETS)]
    if rng.random() < 0.3:
        argv += ["--top", str(rng.choice((0, 1, 3, -1, 2**63)))]
    if rng.random() < 0.3:
        argv += ["--max-micro-batch", str(_int(rng))]
    if rng.random() < 0.2:
        argv += ["--memory-headroom-gib", rng.choice(("0", "1.5", "-1", "nan", "inf", "1e300"))]
    if rng.random() < 0.2:
        argv += ["--train-tokens", str(_int(rng))]
    if rng.random() < 0.2:
        argv += ["--objective", rng.choice(("iteration-time", "tokens-per-second", "gpu-hours"))]
    for flag in ("--allow-cross-node-tp", "--no-megatron-rules"):
        if rng.random() < 0.15:
            argv.append(flag)
    if rng.random() < 0.2:
        argv += ["--tp-comm-overlap", rng.choice(("off", "on", "both", "bth", _text(rng)))]
    if rng.random() < 0.15:
        argv += ["--pipeline-layouts", rng.choice(("even", "balanced", "uneven"))]
    if rng.random() < 0.15:
        argv += ["--context-parallel", *_degrees(rng)]
        if rng.random() < 0.5:
            argv += ["--cp-comm-type", *rng.sample(("p2p", "all_gather", "a2a", "a2a+p2p", "x"), 2)]
    if rng.random() < 0.15:
        argv += ["--expert-parallel", *_degrees(rng)]
    if rng.random() < 0.1:
        argv += ["--expert-tensor-parallel", *_degrees(rng)]
    if rng.random() < 0.1:
        argv += ["--dispatcher", *rng.sample(_DISPATCHERS, rng.randint(1, 3))]
    if rng.random() < 0.15:
        argv += ["--precision", *rng.sample(_RECIPES, rng.randint(1, 3))]
    if rng.random() < 0.1:
        argv += ["--seq-length", str(rng.choice((1, 2048, 131072, _int(rng))))]
    return argv


_CSV_TARGETS = ("-", "-", "{dir}/c.csv", "{dir}/missing/c.csv", "{dir}")
_DISPATCHERS = (
    "alltoall",
    "allgather",
    "flex-deepep",
    "flex-hybridep",
    "flex-ncclep",
    "alltoall+overlap",
    "allgather+overlap",
    "all2all",
)
_RECIPES = (
    "bf16",
    "fp16",
    "fp8-delayed",
    "fp8-tensorwise",
    "fp8-blockwise",
    "mxfp8",
    "nvfp4",
    "fp8",
)


def _degrees(rng: random.Random) -> list[str]:
    if rng.random() < 0.3:
        return ["auto"]
    return [
        str(rng.choice((1, 2, 4, 8, 3, 0, -2, 2**40, _int(rng)))) for _ in range(rng.randint(1, 3))
    ]


def _search(rng: random.Random) -> Case:
    return Case("search", tuple(_search_argv(rng, small=False)))


def _explain(rng: random.Random) -> Case:
    words = []
    for _ in range(rng.randint(0, 7)):
        word = rng.choice(STRATEGY_WORDS)
        value = rng.choice((str(_int(rng)), "on", "off", "yes", "default", "full", _text(rng)))
        words.append(f"{word}={value}" if rng.random() < 0.95 else word)
    argv = _search_argv(rng, small=True)
    return Case("explain", (*argv, "--explain", " ".join(words)))


def _infer(rng: random.Random) -> Case:
    argv = ["infer", str(EXAMPLES / SERVING_FILE)]
    if rng.random() < 0.5:
        argv.append("--search")
    if rng.random() < 0.3:
        argv += ["--latency-target-ms", rng.choice(("30", "0", "-1", "nan", "inf", "1e-9"))]
    if rng.random() < 0.3:
        argv += ["--top", str(rng.choice((1, 3, 0, -1, 2**63)))]
    if rng.random() < 0.3:
        argv += ["--objective", rng.choice(("throughput", "latency"))]
    if rng.random() < 0.3:
        argv.append("--json")
    argv += _sets(rng, INFERENCE_NAMES, rng.randint(0, 3))
    return Case("infer", tuple(argv))


@functools.cache
def _fixture_runs(name: str) -> tuple[str, tuple[str, ...]]:
    """A fixture's text before its first ``[[run]]`` and each run's text."""
    text = (FIXTURES / name).read_text(encoding="utf-8")
    head, *runs = text.split("\n[[run]]\n")
    return head + "\n", tuple("[[run]]\n" + run + "\n" for run in runs)


def one_run_fixture(rng: random.Random, name: str) -> str:
    """The fixture ``name`` cut to one of its runs (a validate case costs one plan or so)."""
    head, runs = _fixture_runs(name)
    return head + rng.choice(runs)


def _perturbed(rng: random.Random, text: str) -> str:
    lines = text.splitlines()
    for _ in range(rng.randint(0, 3)):
        i = rng.randrange(len(lines))
        key, sep, _ = lines[i].partition(" = ")
        if sep and not key.startswith("#"):
            lines[i] = f"{key} = {_toml_value(_scalar(rng))}"
    return _garble(rng, "\n".join(lines) + "\n")


def _fixture(rng: random.Random) -> Case:
    """``validate`` on the four fixtures, each cut to one run and one of them perturbed, or
    ``calibrate`` on a perturbed published run."""
    command = rng.choice(("validate", "calibrate"))
    if command == "calibrate":
        argv = ["calibrate", "--fixture", "{dir}/runs.toml"]
        if rng.random() < 0.5:
            argv += ["--fit", rng.choice(("narayanan2021_table1", "korthikanti2022_table4"))]
        if rng.random() < 0.3:
            argv += ["--system", rng.choice((*SYSTEM_PRESETS, "nope"))]
        text = _perturbed(rng, one_run_fixture(rng, "published_runs.toml"))
        return Case("fixture", tuple(argv), (("runs.toml", text),))
    perturbed = rng.choice(tuple(VALIDATE_FIXTURES))
    argv = ["validate"]
    files = []
    for flag, name in VALIDATE_FIXTURES.items():
        text = one_run_fixture(rng, name)
        files.append((name, _perturbed(rng, text) if flag == perturbed else text))
        argv += [flag, "{dir}/" + name]
    argv += rng.choice(([], ["--summary-only"], ["--json"]))
    return Case("fixture", tuple(argv), tuple(files))


def _sweep(rng: random.Random) -> Case:
    """A sweep file (grid and options, often wrong or huge) and flags; a sweep the checks
    accept would start Ray, which :func:`run_case` stops at the door (exit 0)."""
    data: dict[str, object] = {
        "model": rng.sample(MODEL_PRESETS, rng.randint(1, 3)),
        "system": rng.sample(SYSTEM_PRESETS, rng.randint(1, 2)),
        "gpus": [rng.choice((8, 64, 1024, _int(rng))) for _ in range(rng.randint(1, 3))],
        "global_batch": [rng.choice((16, 1024, 1536, _int(rng))) for _ in range(rng.randint(1, 2))],
    }
    roll = rng.random()
    if roll < 0.1:  # a grid past MAX_SWEEP_CELLS
        data["gpus"] = list(range(1, rng.choice((2, 1200))))
        data["global_batch"] = list(range(1, rng.choice((900, 1001))))
    elif roll < 0.2:
        data["gpus"] = [9_316_358_251_200]
    elif roll < 0.3:
        data["gpus"] = [_scalar(rng)]
    for key in ("seq_length", "train_tokens", "memory_headroom_gib", "max_micro_batch"):
        if rng.random() < 0.2:
            value = _scalar(rng)
            data[key] = [value] if key == "seq_length" else value
    for key in ("allow_cross_node_tp", "megatron_rules"):
        if rng.random() < 0.1:
            data[key] = _scalar(rng) if rng.random() < 0.3 else rng.random() < 0.5
    if rng.random() < 0.15:
        data["flops_convention"] = rng.choice(("6nd", "megatron-legacy", "6ND", _text(rng)))
    if rng.random() < 0.2:
        data["precision"] = rng.sample(_RECIPES, rng.randint(1, 2))
    if rng.random() < 0.3:
        data["price"] = {rng.choice(SYSTEM_PRESETS): rng.choice((1.8, 0, -1, "x", 1e308))}
    if rng.random() < 0.1:
        data[_key(rng, ("model", "system", "gpus", "global_batch", "extra"))] = _scalar(rng)
    argv = ["sweep", "{dir}/sweep.toml", "--out", f"{{dir}}/sweep-{rng.randrange(10**9)}"]
    if rng.random() < 0.2:
        argv += ["--gpus", *(str(_int(rng)) for _ in range(rng.randint(1, 2)))]
    if rng.random() < 0.15:
        argv += ["--workers", str(rng.choice((0, 1, -1, 2)))]
    if rng.random() < 0.15:
        argv += ["--plot", rng.choice(("{dir}/s.png", "{dir}/s.svg", "{dir}/s.jpg"))]
    if rng.random() < 0.15:
        argv += ["--plot-metric", rng.choice(("cost", "tokens-per-second", "tps"))]
    if rng.random() < 0.15:
        argv += ["--price", rng.choice(("dgx-h100=2.5", "dgx-h100", "=1", "dgx-b200=x"))]
    if rng.random() < 0.15:
        argv += ["--html", rng.choice(("{dir}/s.html", "{dir}/missing/s.html"))]
    if rng.random() < 0.1:
        argv.append("--json")
    text = _garble(rng, to_toml_top(data))
    return Case("sweep", tuple(argv), (("sweep.toml", text),))


def to_toml_top(data: dict[str, object]) -> str:
    """A TOML document of top-level keys (tables written inline)."""
    return "".join(f"{json.dumps(k)} = {_toml_value(v)}\n" for k, v in data.items())


def _html(rng: random.Random) -> Case:
    """``--html`` output of plan, simulate and search into the case's folder (or a folder that
    does not exist)."""
    target = rng.choice(("{dir}/r.html", "{dir}/r.html", "{dir}/missing/r.html", "{dir}"))
    command = rng.choice(("plan", "simulate", "search"))
    if command == "search":
        argv = _search_argv(rng, small=True)
    else:
        file = rng.choice(TRAINING_FILES)
        argv = [command, str(EXAMPLES / file), *_sets(rng, TRAINING_NAMES, rng.randint(0, 2))]
    return Case("html", (*argv, "--html", target))


def _presets(rng: random.Random) -> Case:
    argv = ["presets"]
    if rng.random() < 0.8:
        argv.append(rng.choice(("all", "models", "systems", "model", _text(rng) or "x")))
    return Case("presets", tuple(argv))


_MAKERS = {
    "flat": _flat,
    "set": _set,
    "toml": _toml,
    "json": _json,
    "yaml": _yaml_case,
    "hf": _hf,
    "explain": _explain,
    "search": _search,
    "infer": _infer,
    "fixture": _fixture,
    "sweep": _sweep,
    "html": _html,
    "presets": _presets,
}


def draw_case(rng: random.Random, form: str | None = None) -> Case:
    """One case of ``form`` (any form when None)."""
    return _MAKERS[rng.choice(FORMS) if form is None else form](rng)


# --------------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------------
def run_case(case: Case, folder: Path) -> Outcome:
    """Write the case's files into ``folder`` and run ``main(argv)`` in this process."""
    from blueprinting.cli.main import main

    folder.mkdir(parents=True, exist_ok=True)
    for name, text in case.files:
        (folder / name).write_text(text, encoding="utf-8", errors="surrogatepass")
    argv = [arg.replace("{dir}", str(folder)) for arg in case.argv]
    out, err = io.StringIO(), io.StringIO()
    crash: str | None = None
    start, cpu_start = time.perf_counter(), time.process_time()
    with (
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
        _ray_stopped_at_the_door(case.command == "sweep"),
    ):
        try:
            code = main(argv)
        except SystemExit as exit_:  # argparse: usage errors exit 2
            code = exit_.code if isinstance(exit_.code, int) else 2
        except RayWouldStartError:
            code = 0  # every check passed: the sweep would now compute its cells
            print("fuzz: the sweep passed its checks; Ray not started", file=sys.stderr)
        except BaseException:  # a bug: report it, never let it escape
            code = -1
            crash = traceback.format_exc()
    return Outcome(
        code,
        out.getvalue(),
        err.getvalue(),
        time.perf_counter() - start,
        crash,
        time.process_time() - cpu_start,
    )


class RayWouldStartError(Exception):
    """Raised where a fuzzed sweep that passed every check would start Ray."""


@contextlib.contextmanager
def _ray_stopped_at_the_door(active: bool) -> Iterator[None]:
    """Within: the sweep runner's Ray session raises :class:`RayWouldStartError` (the fuzz checks
    what a sweep answers before Ray starts, and never starts it)."""
    if not active:
        yield
        return
    from blueprinting.sweep import runner

    def refuse(*_args: object, **_kwargs: object) -> NoReturn:
        raise RayWouldStartError

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(runner, "ray_session", refuse)
        yield


def problems_of(
    case: Case, outcome: Outcome, *, max_seconds: float, max_cpu_seconds: float | None = None
) -> list[str]:
    """What is wrong with ``outcome``: empty for a good answer. ``max_seconds`` bounds the wall
    time, ``max_cpu_seconds`` (when given) the CPU time, which a machine shared with other
    work does not inflate."""
    found: list[str] = []
    if outcome.crash is not None:
        found.append(f"exception escaped main():\n{outcome.crash}")
    elif outcome.code not in (0, 1, 2):
        found.append(f"exit status {outcome.code}")
    elif outcome.code != 0 and not (outcome.out + outcome.err).strip():
        found.append(f"exit status {outcome.code} without a message")
    if "Traceback (most recent call last)" in outcome.err + outcome.out:
        found.append("a traceback in the output")
    took = f"took {outcome.seconds:.2f} s wall, {outcome.cpu_seconds:.2f} s CPU"
    extra = streamed_allowance(outcome.err)
    # the wall bound only catches hangs; a loaded machine may take twice the CPU time
    wall = max_seconds + 2 * extra
    if outcome.seconds > wall:
        found.append(f"{took} (wall bound {wall:g} s)")
    if max_cpu_seconds is not None and outcome.cpu_seconds > max_cpu_seconds + extra:
        found.append(f"{took} (CPU bound {max_cpu_seconds + extra:.1f} s)")
    found.extend(contradictions(outcome.err))
    return found


_STREAMED = re.compile(
    r"^search: (?:costing|evaluating|writing) [0-9,]+ .* time bound \(\w+\): "
    r"allow ([0-9.]+) s more of CPU$",
    re.MULTILINE,
)


def streamed_allowance(err: str) -> float:
    """The CPU seconds a case may take beyond its bound: what the notices of a search that said
    up front that it streams more than the time bound covers state (``limits.
    search_blocks_notice``, ``search_candidates_notice``, ``search_csv_notice``), added up; 0
    without a notice."""
    return sum(float(found.group(1)) for found in _STREAMED.finditer(err))


def contradictions(err: str) -> list[str]:
    """A key reported both with a wrong value and as missing."""
    lines = [line.strip() for line in err.splitlines()]
    wrong = {
        line[2:].split(" ", 1)[0] for line in lines if " must be " in line and line[:2] == "- "
    }
    out = []
    for line in lines:
        if "missing" in line:
            named = line.rsplit(":", 1)[-1]
            for key in wrong:
                if key in [k.strip() for k in named.split(",")]:
                    out.append(f"{key!r} reported both wrong and missing")
    return out
