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

from collections.abc import Callable, Mapping, Sequence
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
    AttentionWindow,
    Datatype,
    DenseFeedForward,
    EmbeddingTying,
    FeedForward,
    FullAttention,
    MixtureOfExperts,
    MlpActivation,
    MoeLayerFrequency,
    MoeLayerList,
    MultiLatentAttention,
    Normalization,
    PositionEmbedding,
    RouterScore,
    SelfAttention,
    SlidingWindow,
    SoftmaxType,
    StandardAttention,
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
        is given (the CLI's ``--system``, which replaces the file's section; a ``.toml`` /
        ``.json`` name is a system file's table), else the file's. A :class:`ConfigError`
        naming the file when there is neither."""
        from blueprinting.hardware.system_mapping import system_section_for

        section: dict[str, object] = (
            system_section_for(preset) if preset is not None else dict(self.system)
        )
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
    """A model from a Hugging Face ``config.json`` with LlamaConfig-style keys, and the
    mixture-of-experts architectures by ``model_type`` (:data:`HF_MOE_MODEL_TYPES`, read by
    :func:`_hf_moe`): ``deepseek_v2`` / ``deepseek_v3`` / ``kimi_k2`` (MLA + MoE), ``mixtral``,
    ``qwen3_moe``, ``gpt_oss``.

    Keys read (``transformers/models/llama/configuration_llama.py`` defaults where absent):
    hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
    num_key_value_heads (default: heads), vocab_size, max_position_embeddings (the model's
    seq_length), rms_norm_eps (RMSNorm when present, else LayerNorm), tie_word_embeddings
    (default false), head_dim (default h / heads), torch_dtype (default bfloat16), hidden_act
    (silu: SwiGLU, the Llama MLP; gelu*: GELU), attention_bias / mlp_bias (default false).
    Positions are rotary (GPT-OSS's YaRN, with its ``swiglu_limit`` as the GLU clamp). Other
    keys are ignored: HF configs carry many irrelevant ones. The name
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
    elif act == "relu2":
        # transformers' ACT2FN "relu2" (ReLUSquaredActivation): Nemotron's squared ReLU
        activation = MlpActivation.SQUARED_RELU
    elif act not in ("silu", "swish"):
        problems.append(f"hidden_act {act!r} is not supported (silu, gelu or relu2)")
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
    # Hugging Face models carry their own dropout (0.0 when unset, as transformers' configs
    # default it), and Megatron-Bridge's bridges pass it on (model_bridge.py maps
    # attention_dropout; the Llama, DeepSeek and GPT-OSS bridges set hidden_dropout = 0.0)
    dropouts: dict[str, float] = {}
    for key in ("attention_dropout", "hidden_dropout"):
        value = data.get(key, 0.0)
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1:
            problems.append(f"{key} must be a probability in [0, 1), got {value!r}")
            value = 0.0
        dropouts[key] = float(value)
    raw_name = data.get("_name_or_path")
    model_name = name or (raw_name if isinstance(raw_name, str) and raw_name else fallback_name)
    model_type = data.get("model_type")
    moe = _HfMoe()
    if isinstance(model_type, str) and model_type in HF_MOE_MODEL_TYPES:
        moe = _hf_moe(data, model_type, layers=layers, get_int=get_int, problems=problems)
        seq = moe.seq_length or seq
        bias = bias or moe.add_bias_linear
        kv_channels = moe.kv_channels or kv_channels
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
        position_embedding=moe.position_embedding,
        embeddings=EmbeddingTying.TIED if tie else EmbeddingTying.UNTIED,
        add_bias_linear=bias,
        datatype=datatype,
        self_attention=moe.self_attention,
        feed_forward=moe.feed_forward,
        qk_layernorm=moe.qk_layernorm,
        mtp_num_layers=moe.mtp_num_layers,
        softmax_type=moe.softmax_type,
        attention_window=moe.attention_window,
        attention_dropout=dropouts["attention_dropout"],
        hidden_dropout=dropouts["hidden_dropout"],
        activation_func_clamp_value=moe.activation_func_clamp_value,
    )


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class _HfMoe:
    """What a MoE ``model_type`` adds to the Llama-style reading (None / defaults: nothing)."""

    seq_length: int | None = None
    kv_channels: int | None = None
    add_bias_linear: bool = False
    self_attention: SelfAttention = field(default_factory=StandardAttention)
    feed_forward: FeedForward = field(default_factory=DenseFeedForward)
    qk_layernorm: bool = False
    mtp_num_layers: int = 0
    softmax_type: SoftmaxType = SoftmaxType.VANILLA
    attention_window: AttentionWindow = field(default_factory=FullAttention)
    position_embedding: PositionEmbedding = PositionEmbedding.ROPE
    activation_func_clamp_value: float | None = None


#: HF ``model_type`` values read as mixtures of experts.
HF_MOE_MODEL_TYPES = frozenset(
    {"deepseek_v2", "deepseek_v3", "kimi_k2", "mixtral", "qwen3_moe", "gpt_oss"}
)

_HF_SCORES = {"softmax": RouterScore.SOFTMAX, "sigmoid": RouterScore.SIGMOID}


def _hf_moe(
    data: Mapping[str, object],
    model_type: str,
    *,
    layers: int,
    get_int: Callable[..., int],
    problems: list[str],
) -> _HfMoe:
    """The MoE / MLA / MTP / sink / window fields of one of :data:`HF_MOE_MODEL_TYPES`, HF names
    mapped as the shared reference section 2.1 lists them (transformers'
    ``configuration_deepseek_v3.py``, ``configuration_mixtral.py``, ``configuration_qwen3_moe.py``,
    ``configuration_gpt_oss.py``). The sequence length is the pre-training context:
    ``rope_scaling.original_max_position_embeddings`` when YaRN extends it, else
    ``max_position_embeddings``."""
    seq: int | None = None
    rope = data.get("rope_scaling")
    if isinstance(rope, Mapping):
        original = rope.get("original_max_position_embeddings")
        seq = original if is_positive_int(original) else None
    match model_type:
        case "deepseek_v2" | "deepseek_v3" | "kimi_k2":
            dense = data.get("first_k_dense_replace", 0)
            if not (type(dense) is int and 0 <= dense <= layers):
                problems.append(f"first_k_dense_replace must be 0..{layers}, got {dense!r}")
                dense = 0
            score_key = data.get("scoring_func", "softmax")
            score = _HF_SCORES.get(score_key) if isinstance(score_key, str) else None
            if score is None:
                problems.append(f"scoring_func must be softmax or sigmoid, got {score_key!r}")
                score = RouterScore.SOFTMAX
            expert_ffn = get_int("moe_intermediate_size")
            shared = data.get("n_shared_experts") or 0
            if not (type(shared) is int and shared >= 0):
                problems.append(f"n_shared_experts must be a count, got {shared!r}")
                shared = 0
            q_lora = data.get("q_lora_rank")
            if q_lora is not None and not is_positive_int(q_lora):
                problems.extend(positive_int_problems(None, q_lora_rank=q_lora))
                q_lora = None
            mtp = data.get("num_nextn_predict_layers") or 0
            if not (type(mtp) is int and mtp >= 0):
                problems.append(f"num_nextn_predict_layers must be a count, got {mtp!r}")
                mtp = 0
            v_head = get_int("v_head_dim")
            return _HfMoe(
                seq_length=seq,
                kv_channels=v_head,
                self_attention=MultiLatentAttention(
                    q_lora_rank=q_lora,
                    kv_lora_rank=get_int("kv_lora_rank"),
                    qk_head_dim=get_int("qk_nope_head_dim"),
                    qk_pos_emb_head_dim=get_int("qk_rope_head_dim"),
                    v_head_dim=v_head,
                ),
                qk_layernorm=True,
                mtp_num_layers=mtp,
                feed_forward=_hf_experts(
                    problems,
                    num_experts=get_int("n_routed_experts"),
                    top_k=get_int("num_experts_per_tok"),
                    expert_ffn_hidden_size=expert_ffn,
                    shared_expert_ffn_hidden_size=shared * expert_ffn,
                    score_function=score,
                    # aux-loss-free balancing: the e_score_correction_bias of noaux_tc
                    expert_bias=data.get("topk_method") == "noaux_tc",
                    layer_pattern=(
                        MoeLayerList(layers=(False,) * dense + (True,) * (layers - dense))
                        if dense
                        else MoeLayerFrequency()
                    ),
                ),
            )
        case "mixtral":
            return _HfMoe(
                seq_length=seq,
                feed_forward=_hf_experts(
                    problems,
                    num_experts=get_int("num_local_experts"),
                    top_k=get_int("num_experts_per_tok"),
                    expert_ffn_hidden_size=get_int("intermediate_size"),
                ),
            )
        case "qwen3_moe":
            step = get_int("decoder_sparse_step", 1)
            dense_only = data.get("mlp_only_layers") or []
            if not (isinstance(dense_only, list) and all(type(i) is int for i in dense_only)):
                problems.append(
                    f"mlp_only_layers must be a list of layer indices, got {dense_only!r}"
                )
                dense_only = []
            flags = tuple((i + 1) % step == 0 and i not in dense_only for i in range(layers))
            return _HfMoe(
                seq_length=seq,
                qk_layernorm=True,
                feed_forward=_hf_experts(
                    problems,
                    num_experts=get_int("num_experts"),
                    top_k=get_int("num_experts_per_tok"),
                    expert_ffn_hidden_size=get_int("moe_intermediate_size"),
                    layer_pattern=(
                        MoeLayerFrequency() if all(flags) else MoeLayerList(layers=flags)
                    ),
                ),
            )
        case "gpt_oss":
            top_k = data.get("experts_per_token", data.get("num_experts_per_tok"))
            # Megatron-Bridge's bridge reads GPT-OSS as position_embedding_type "yarn" and
            # activation_func_clamp_value 7.0 (r0.6.0 @6124fbe38 gpt_oss_bridge.py l.65, l.83),
            # the config's swiglu_limit
            limit = data.get("swiglu_limit")
            clamp = float(limit) if isinstance(limit, int | float) and limit > 0 else None
            return _HfMoe(
                position_embedding=PositionEmbedding.YARN,
                activation_func_clamp_value=clamp,
                seq_length=seq,
                add_bias_linear=True,  # QKV, O, router and expert biases
                softmax_type=SoftmaxType.LEARNABLE,  # the per-head sinks
                attention_window=_hf_window(data, layers, get_int, problems),
                feed_forward=_hf_experts(
                    problems,
                    num_experts=get_int("num_local_experts"),
                    top_k=top_k if is_positive_int(top_k) else get_int("experts_per_token"),
                    expert_ffn_hidden_size=get_int("intermediate_size"),
                ),
            )
        case _:
            problems.append(f"model_type {model_type!r} is not a mixture of experts")
            return _HfMoe()


def _hf_experts(
    problems: list[str],
    *,
    num_experts: int,
    top_k: int,
    expert_ffn_hidden_size: int,
    shared_expert_ffn_hidden_size: int = 0,
    score_function: RouterScore = RouterScore.SOFTMAX,
    expert_bias: bool = False,
    layer_pattern: MoeLayerFrequency | MoeLayerList | None = None,
) -> FeedForward:
    try:
        return MixtureOfExperts(
            num_experts=num_experts,
            top_k=top_k,
            expert_ffn_hidden_size=expert_ffn_hidden_size,
            shared_expert_ffn_hidden_size=shared_expert_ffn_hidden_size,
            score_function=score_function,
            expert_bias=expert_bias,
            layer_pattern=layer_pattern or MoeLayerFrequency(),
        )
    except ConfigError as error:
        problems.extend(error.problems)
        return DenseFeedForward()


def _hf_window(
    data: Mapping[str, object],
    layers: int,
    get_int: Callable[..., int],
    problems: list[str],
) -> AttentionWindow:
    """gpt-oss's ``sliding_window`` on the layers ``layer_types`` marks ``sliding_attention``,
    as Megatron-Bridge maps it: window_size (sliding_window, 0), and the full layers every N-th
    (``window_attn_skip_freq``)."""
    size = get_int("sliding_window")
    kinds = data.get("layer_types")
    if kinds is None:
        return SlidingWindow(size=size)
    if not (isinstance(kinds, list) and len(kinds) == layers):
        problems.append(f"layer_types must list one kind per layer ({layers}), got {kinds!r}")
        return SlidingWindow(size=size)
    full = [i for i, kind in enumerate(kinds) if kind == "full_attention"]
    if not full:
        return SlidingWindow(size=size)
    every = full[0] + 1
    expected = [i for i in range(layers) if (i + 1) % every == 0]
    if full != expected:
        problems.append(
            "layer_types: full attention on layers "
            f"{full} is not every {every}-th layer (window_attn_skip_freq cannot say it)"
        )
    return SlidingWindow(size=size, full_every=every)


__all__ = [
    "SECTIONS",
    "ConfigFile",
    "apply_overrides",
    "load_config",
    "model_from_hf_config",
    "parse_value",
    "route_section_overrides",
]
