"""Strategy files (TOML, JSON, YAML) and Hugging Face ``config.json`` models.

A strategy file has these sections, and no others::

    [model]      preset = "gpt3-175b" and/or model keys (keys override the preset);
                 or hf_config = "path/to/config.json" (relative to the file)
    [training]   flat Megatron-LM keys (see flat_keys.py), or
    [inference]  inference keys; exactly one of the two
    [system]     kept raw for the hardware module (e.g. preset = "dgx-a100-80gb")

``--set key=value`` overrides (:func:`apply_overrides`) apply to the flat keys after the model and
run sections are merged; ``model.preset=...`` and ``system.KEY=...`` address those sections.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import final

from blueprinting.errors import ConfigError, is_positive_int, positive_int_problems
from blueprinting.mapping.documents import parse_json, parse_toml, parse_yaml, read_text
from blueprinting.mapping.flat_keys import (
    FlatValue,
    canonical_key,
    from_mapping,
    inference_from_mapping,
)
from blueprinting.mapping.model import (
    Datatype,
    EmbeddingTying,
    MlpActivation,
    Normalization,
    PositionEmbedding,
    TransformerModelSpec,
)
from blueprinting.mapping.presets import did_you_mean, model_preset
from blueprinting.mapping.transformer import InferenceSpec, TrainingSpec

SECTIONS = ("model", "training", "inference", "system")


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class ConfigFile:
    """What a strategy file holds: one training or one inference spec, and the raw system
    section that :mod:`blueprinting.hardware` interprets."""

    spec: TrainingSpec | InferenceSpec
    system: Mapping[str, object] = field(default_factory=lambda: MappingProxyType({}))
    source: str

    @property
    def training(self) -> TrainingSpec | None:
        return self.spec if isinstance(self.spec, TrainingSpec) else None

    @property
    def inference(self) -> InferenceSpec | None:
        return self.spec if isinstance(self.spec, InferenceSpec) else None

    def system_section(self, preset: str | None = None) -> dict[str, object]:
        """The [system] table the hardware is built from: ``{"preset": preset}`` when a preset
        is given (the CLI's ``--system``, which replaces the file's section), else the file's.
        A :class:`ConfigError` naming the file when there is neither."""
        section: dict[str, object] = {"preset": preset} if preset is not None else dict(self.system)
        if not section:
            raise ConfigError(
                ["the file has no [system] section; pass --system"], source=self.source
            )
        return section

    def __str__(self) -> str:
        return str(self.spec)


# --------------------------------------------------------------------------------------------
# Overrides
# --------------------------------------------------------------------------------------------
def parse_value(text: str) -> FlatValue | float:
    """``--set`` value parsing: int, then float, then true/false, else the string itself."""
    stripped = text.strip()
    try:
        return int(stripped)
    except ValueError:
        pass
    try:
        return float(stripped)
    except ValueError:
        pass
    lowered = stripped.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    return stripped


def route_section_overrides(
    overrides: Sequence[str],
    system: dict[str, object],
    model: dict[str, object] | None = None,
) -> list[str]:
    """Apply the section-qualified overrides in place and return the others, in order.

    ``system.A.B=V`` sets ``system[A][B]`` (:func:`set_nested`); ``model.KEY=V`` sets
    ``model[KEY]`` when a ``model`` table is given (a strategy file's preset/hf_config live
    there). Values are parsed with :func:`parse_value`. What is returned are flat keys for
    :func:`apply_overrides`, malformed items included so that it reports them.
    """
    flat: list[str] = []
    for item in overrides:
        key, sep, value = item.partition("=")
        section, dot, rest = key.strip().partition(".")
        if sep and dot and section == "system":
            set_nested(system, rest.split("."), parse_value(value))
        elif sep and dot and section == "model" and model is not None:
            model[canonical_key(rest)] = parse_value(value)
        else:
            flat.append(item)
    return flat


def apply_overrides(flat: Mapping[str, object], overrides: Sequence[str]) -> dict[str, object]:
    """``flat`` updated with ``key=value`` strings (keys canonicalized: dashes to underscores).

    Every malformed override is reported at once in one :class:`ConfigError`.
    """
    out = {canonical_key(k): v for k, v in flat.items()}
    problems: list[str] = []
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            problems.append(f"override {item!r} is not of the form key=value")
            continue
        out[canonical_key(key)] = parse_value(value)
    if problems:
        raise ConfigError(problems, source="--set")
    return out


# --------------------------------------------------------------------------------------------
# Reading files
# --------------------------------------------------------------------------------------------
def _read_mapping(path: Path) -> Mapping[str, object]:
    source = str(path)
    suffix = path.suffix.lower()
    if suffix not in (".toml", ".json", ".yaml", ".yml"):
        raise ConfigError(
            [f"unknown file type {suffix!r}: use .toml, .json, .yaml or .yml"], source=source
        )
    text = read_text(path)
    data: object
    if suffix == ".toml":
        data = parse_toml(text, source)
    elif suffix == ".json":
        data = parse_json(text, source)
    else:
        data = parse_yaml(text, source)
    if not isinstance(data, Mapping):
        raise ConfigError(["the file must hold a table/object at top level"], source=source)
    return data


def _section(data: Mapping[str, object], name: str, problems: list[str]) -> dict[str, object]:
    raw = data.get(name)
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        problems.append(f"section [{name}] must be a table, got {type(raw).__name__}")
        return {}
    return {str(k): v for k, v in raw.items()}


def set_nested(target: dict[str, object], path: list[str], value: object) -> None:
    """``system.accelerator.hbm.capacity_bytes=...``: set a value deep in the [system] table,
    creating (or copying, never mutating the caller's) the tables on the way."""
    head, *rest = path
    if not rest:
        target[head] = value
        return
    inner = target.get(head)
    table: dict[str, object] = dict(inner) if isinstance(inner, Mapping) else {}
    target[head] = table
    set_nested(table, rest, value)


def load_config(path: str | Path, *, overrides: Sequence[str] = ()) -> ConfigFile:
    """Read a strategy file and build its spec (see the module docstring).

    Raises :class:`ConfigError` for anything malformed (every problem at once where possible)
    and :class:`InvalidStrategyError` only for the world-size law ``from_mapping`` checks; the
    other laws are for :mod:`blueprinting.mapping.laws`.
    """
    file = Path(path)
    source = str(file)
    data = _read_mapping(file)
    problems: list[str] = []
    for name in data:
        if name not in SECTIONS:
            problems.append(f"unknown section [{name}]{did_you_mean(str(name), SECTIONS)}")
    model_section = _section(data, "model", problems)
    training = _section(data, "training", problems)
    inference = _section(data, "inference", problems)
    system = _section(data, "system", problems)
    if ("training" in data) == ("inference" in data):
        problems.append("the file needs exactly one of [training] or [inference]")

    # Section-qualified overrides address [model]'s preset/hf_config and [system]; the rest are
    # flat keys.
    flat_overrides = route_section_overrides(overrides, system, model_section)

    base = _base_model(model_section, file, problems)
    model_keys = {k: v for k, v in model_section.items() if k not in ("preset", "hf_config")}
    run_keys = training or inference
    flat: dict[str, object] = {}
    for raw_key, raw_value in [*model_keys.items(), *run_keys.items()]:
        canonical = canonical_key(raw_key)
        if canonical in flat:
            problems.append(f"key {canonical!r} is given in more than one section")
        flat[canonical] = raw_value
    if problems:
        raise ConfigError(problems, source=source)
    try:
        flat = apply_overrides(flat, flat_overrides)
        spec: TrainingSpec | InferenceSpec = (
            from_mapping(flat, model=base)
            if "training" in data
            else inference_from_mapping(flat, model=base)
        )
    except ConfigError as error:
        raise ConfigError(error.problems, source=source) from None
    return ConfigFile(spec=spec, system=MappingProxyType(system), source=source)


def _base_model(
    section: Mapping[str, object], file: Path, problems: list[str]
) -> TransformerModelSpec | None:
    preset = section.get("preset")
    hf = section.get("hf_config")
    if preset is not None and hf is not None:
        problems.append("[model] takes preset or hf_config, not both")
        return None
    if preset is not None:
        if not isinstance(preset, str):
            problems.append(f"[model] preset must be a string, got {preset!r}")
            return None
        try:
            return model_preset(preset)
        except ConfigError as error:
            problems.extend(error.problems)
            return None
    if hf is not None:
        if not isinstance(hf, str):
            problems.append(f"[model] hf_config must be a path string, got {hf!r}")
            return None
        try:
            return model_from_hf_config(file.parent / hf)
        except ConfigError as error:
            problems.extend(error.problems)
            return None
    return None


# --------------------------------------------------------------------------------------------
# Hugging Face config.json
# --------------------------------------------------------------------------------------------
_HF_DTYPES = {
    "bfloat16": Datatype.BF16,
    "float16": Datatype.FP16,
    "float32": Datatype.FP32,
}


def model_from_hf_config(
    path_or_mapping: str | Path | Mapping[str, object], *, name: str | None = None
) -> TransformerModelSpec:
    """A model from a Hugging Face ``config.json`` with LlamaConfig-style keys.

    Keys read (``transformers/models/llama/configuration_llama.py`` defaults where absent):
    hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
    num_key_value_heads (default: heads), vocab_size, max_position_embeddings (the model's
    seq_length), rms_norm_eps (RMSNorm when present, else LayerNorm), tie_word_embeddings
    (default false), head_dim (default h / heads), torch_dtype (default bfloat16), hidden_act
    (silu: SwiGLU, the Llama MLP; gelu*: GELU), attention_bias / mlp_bias (default false).
    Positions are rotary. Other keys are ignored: HF configs carry many irrelevant ones. The name
    is ``name``, else ``_name_or_path``, else the file's folder.
    """
    if isinstance(path_or_mapping, Mapping):
        data: Mapping[str, object] = path_or_mapping
        source = "config.json mapping"
        fallback_name = "hf-model"
    else:
        file = Path(path_or_mapping)
        source = str(file)
        loaded = parse_json(read_text(file), source)
        if not isinstance(loaded, Mapping):
            raise ConfigError(["config.json must hold an object"], source=source)
        data = loaded
        fallback_name = file.parent.name or file.stem
    problems: list[str] = []

    def get_int(key: str, default: int | None = None) -> int:
        value = data.get(key, default)
        if is_positive_int(value):
            return value
        problems.extend(
            positive_int_problems(None, **{key: value}) if key in data else [f"{key} is required"]
        )
        return 1

    def get_bool(key: str, default: bool) -> bool:
        value = data.get(key, default)
        if type(value) is not bool:
            problems.append(f"{key} must be a boolean, got {value!r}")
            return default
        return value

    hidden = get_int("hidden_size")
    heads = get_int("num_attention_heads")
    groups = get_int("num_key_value_heads", heads)
    kv_channels = data.get("head_dim")
    if kv_channels is None:
        kv_channels = hidden // heads
    elif not is_positive_int(kv_channels):
        problems.extend(positive_int_problems(None, head_dim=kv_channels))
        kv_channels = 1
    act = data.get("hidden_act", "silu")
    activation = MlpActivation.SWIGLU
    if not isinstance(act, str):
        problems.append(f"hidden_act must be a string, got {act!r}")
    elif act.startswith("gelu"):
        activation = MlpActivation.GELU
    elif act not in ("silu", "swish"):
        problems.append(f"hidden_act {act!r} is not supported (silu or gelu)")
    dtype = data.get("torch_dtype", data.get("dtype", "bfloat16"))
    datatype = _HF_DTYPES.get(dtype) if isinstance(dtype, str) else None
    if datatype is None:
        problems.append(f"torch_dtype must be one of {', '.join(_HF_DTYPES)}, got {dtype!r}")
        datatype = Datatype.BF16
    vocab = get_int("vocab_size")
    layers = get_int("num_hidden_layers")
    ffn = get_int("intermediate_size")
    seq = get_int("max_position_embeddings")
    tie = get_bool("tie_word_embeddings", False)
    bias = get_bool("attention_bias", False) or get_bool("mlp_bias", False)
    raw_name = data.get("_name_or_path")
    model_name = name or (raw_name if isinstance(raw_name, str) and raw_name else fallback_name)
    if problems:
        raise ConfigError(problems, source=source)
    return TransformerModelSpec(
        name=model_name,
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_query_groups=groups,
        kv_channels=kv_channels,
        ffn_hidden_size=ffn,
        seq_length=seq,
        vocab_size=vocab,
        padded_vocab_size=vocab,
        activation=activation,
        normalization=Normalization.RMSNORM if "rms_norm_eps" in data else Normalization.LAYERNORM,
        position_embedding=PositionEmbedding.ROPE,
        embeddings=EmbeddingTying.TIED if tie else EmbeddingTying.UNTIED,
        add_bias_linear=bias,
        datatype=datatype,
    )


__all__ = [
    "SECTIONS",
    "ConfigFile",
    "apply_overrides",
    "load_config",
    "model_from_hf_config",
    "parse_value",
    "route_section_overrides",
]
