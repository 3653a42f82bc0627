"""Regression digests: canonical JSON, SHA-256, snapshot diffs and the configuration list.

The machinery is tested with a fake report function; the digests of the real cost model
(``blueprinting.api.plan``) are checked by the last test.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blueprinting.errors import ConfigError, UnsupportedError
from blueprinting.validation import digests
from blueprinting.validation.digests import (
    FieldChange,
    JsonValue,
    RegressionConfig,
    api_report_function,
    canonical_float,
    canonical_json,
    canonicalize,
    check,
    compute_entries,
    diff,
    digest,
    flatten,
    load_configs,
    read_store,
    write_store,
)

HERE = Path(__file__).resolve().parent
CONFIGS = HERE / "configs.toml"
DIGESTS = HERE / "digests.json"


def fake_report(config: RegressionConfig) -> JsonValue:
    keys = config.strategy_keys
    t = int(keys["tensor_model_parallel_size"])
    p = int(keys["pipeline_model_parallel_size"])
    d = int(keys["data_parallel_size"])
    return {
        "config": config.name,
        "model": config.model,
        "world_size": t * p * d,
        "iteration": {"time_s": (t * p * d) / 3.0 + 0.1, "bubble_fraction": (p - 1) / (p + 7.0)},
        "memory": {"per_stage_bytes": [1.5e9 * (stage + 1) / t for stage in range(p)]},
        "sequence_parallel": bool(keys.get("sequence_parallel", False)),
    }


PINNED_SAMPLE_DIGEST = "3e24419c9e24e4f14bbf419d26ba2922becea6c29b3e84b9b39106ddaf880771"
SAMPLE: JsonValue = {
    "b": [1, 2.5, {"z": None, "a": True}],
    "a": {"y": 0.1, "x": -0.0, "w": 1e-300, "v": 3.0, "u": "é"},
}


# --------------------------------------------------------------------------------------------
# Canonical JSON and digest
# --------------------------------------------------------------------------------------------
def test_canonical_json_text() -> None:
    assert canonical_json(SAMPLE) == (
        '{"a":{"u":"\\u00e9","v":3.0,"w":1e-300,"x":0.0,"y":0.1},"b":[1,2.5,{"a":true,"z":null}]}'
    )


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0.1 + 0.2, "0.3"),
        (1.0 / 3.0, "0.333333333333"),
        (2.0**60, "1.15292150461e+18"),
        (123456789012345.0, "1.23456789012e+14"),
        (-2.0, "-2.0"),
        (float("nan"), '"nan"'),
        (float("-inf"), '"-inf"'),
    ],
)
def test_canonical_float(value: float, text: str) -> None:
    assert canonical_float(value) == text


def test_ulp_noise_does_not_move_the_digest() -> None:
    """Why 12 digits: 0.1 + 0.2 and 0.3 differ by one ulp but are the same figure."""
    assert 0.1 + 0.2 != 0.3
    assert digest({"t": 0.1 + 0.2}) == digest({"t": 0.3})
    assert digest({"t": 0.3 * (1 + 1e-10)}) != digest({"t": 0.3})


def test_digest_is_stable_across_runs_and_platforms() -> None:
    """A fixed value has a fixed digest: a change here means the canonical form changed."""
    assert digest(SAMPLE) == PINNED_SAMPLE_DIGEST
    assert digest(SAMPLE) == digest(json.loads(json.dumps(SAMPLE)))


def test_key_order_and_int_float_distinction() -> None:
    assert digest({"a": 1, "b": 2}) == digest({"b": 2, "a": 1})
    assert digest({"a": 1}) != digest({"a": 1.0})
    assert digest({"a": True}) != digest({"a": 1})


def _perturb(value: JsonValue) -> JsonValue:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value * (1 + 1e-9) if value != 0.0 else 1e-12
    if isinstance(value, str):
        return value + "x"
    if value is None:
        return 0
    raise AssertionError(value)


def _replace(value: JsonValue, path: list[str | int], new: JsonValue) -> JsonValue:
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, Mapping):
        return {k: (_replace(v, rest, new) if k == head else v) for k, v in value.items()}
    assert isinstance(value, list)
    return [(_replace(v, rest, new) if i == head else v) for i, v in enumerate(value)]


def _leaf_paths(value: JsonValue, prefix: list[str | int]) -> list[list[str | int]]:
    if isinstance(value, Mapping):
        return [p for k, v in value.items() for p in _leaf_paths(v, [*prefix, k])]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _leaf_paths(v, [*prefix, i])]
    return [prefix]


def _get(value: JsonValue, path: list[str | int]) -> JsonValue:
    for part in path:
        if isinstance(value, Mapping):
            value = value[str(part)]
        else:
            assert isinstance(value, list) and isinstance(part, int)
            value = value[part]
    return value


def test_digest_is_sensitive_to_every_field_of_every_config() -> None:
    for config in load_configs(CONFIGS):
        report = canonicalize(fake_report(config))
        base = digest(report)
        for path in _leaf_paths(report, []):
            moved = _replace(report, path, _perturb(_get(report, path)))
            assert digest(moved) != base, (config.name, path)


json_leaves = (
    st.none()
    | st.booleans()
    | st.integers(-(10**12), 10**12)
    | st.floats(allow_nan=False, allow_infinity=False, width=64)
    | st.text(max_size=8)
)
json_values = st.recursive(
    json_leaves,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_canonical_snapshot_is_a_fixed_point(value: JsonValue) -> None:
    once = canonicalize(value)
    assert canonical_json(once) == canonical_json(value)
    assert digest(once) == digest(value)
    assert canonicalize(once) == once


@settings(max_examples=200, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False, width=64))
def test_canonical_float_keeps_twelve_digits(value: float) -> None:
    text = canonical_float(value)
    back = float(text)
    assert back == 0.0 if value == 0.0 else math.isclose(back, value, rel_tol=5e-12)
    assert "." in text or "e" in text


# --------------------------------------------------------------------------------------------
# Differences
# --------------------------------------------------------------------------------------------
def test_flatten_uses_dotted_paths() -> None:
    assert flatten(SAMPLE) == {
        "b[0]": 1,
        "b[1]": 2.5,
        "b[2].z": None,
        "b[2].a": True,
        "a.y": 0.1,
        "a.x": -0.0,
        "a.w": 1e-300,
        "a.v": 3.0,
        "a.u": "é",
    }
    assert flatten({"e": {}, "l": []}) == {"e": "{}", "l": "[]"}


def test_diff_reports_path_old_new_and_relative_change() -> None:
    old: JsonValue = {"iteration": {"time_s": 2.0, "steps": [1, 2]}, "name": "a", "gone": 1}
    new: JsonValue = {"iteration": {"time_s": 2.5, "steps": [1, 3]}, "name": "b", "added": True}
    changes = diff(old, new)
    assert changes == (
        FieldChange(path="added", old=None, new=True, present_before=False),
        FieldChange(path="gone", old=1, new=None, present_after=False),
        FieldChange(path="iteration.steps[1]", old=2, new=3),
        FieldChange(path="iteration.time_s", old=2.0, new=2.5),
        FieldChange(path="name", old="a", new="b"),
    )
    assert changes[3].relative_change == 0.25
    assert changes[2].relative_change == 0.5
    assert changes[4].relative_change is None
    assert [str(change) for change in changes] == [
        "added: added, True",
        "gone: removed, was 1",
        "iteration.steps[1]: 2 -> 3 (rel +5.000e-01)",
        "iteration.time_s: 2.0 -> 2.5 (rel +2.500e-01)",
        "name: 'a' -> 'b'",
    ]


def test_relative_change_of_negative_and_zero_values() -> None:
    assert FieldChange(path="x", old=-4.0, new=-2.0).relative_change == 0.5
    assert FieldChange(path="x", old=0.0, new=1.0).relative_change is None
    assert FieldChange(path="x", old=True, new=False).relative_change is None


# --------------------------------------------------------------------------------------------
# Store and check
# --------------------------------------------------------------------------------------------
def test_store_round_trip_and_check(tmp_path: Path) -> None:
    configs = load_configs(CONFIGS)
    entries = compute_entries(configs, fake_report)
    store = tmp_path / "digests.json"
    write_store(store, entries)
    first = store.read_text(encoding="utf-8")
    write_store(store, compute_entries(configs, fake_report))
    assert store.read_text(encoding="utf-8") == first
    stored = read_store(store)
    assert check(stored, entries) == ()
    for name, entry in stored.items():
        assert digest(entry.snapshot) == entry.sha256, name


def test_check_prints_which_fields_moved(tmp_path: Path) -> None:
    configs = load_configs(CONFIGS)[:3]
    stored = compute_entries(configs, fake_report)

    def drifted(config: RegressionConfig) -> JsonValue:
        report = fake_report(config)
        assert isinstance(report, dict)
        if config.name == configs[1].name:
            iteration = report["iteration"]
            assert isinstance(iteration, dict)
            report["iteration"] = {**iteration, "time_s": 1.1 * 3.0}
        return report

    computed = compute_entries(configs[:2], drifted)
    mismatches = check(stored, computed)
    assert [m.name for m in mismatches] == [configs[1].name, configs[2].name]
    moved = mismatches[0]
    old_time = (2 * 1 * 4) / 3.0 + 0.1
    assert [c.path for c in moved.changes] == ["iteration.time_s"]
    assert moved.changes[0].relative_change == pytest.approx((3.3 - old_time) / old_time, rel=1e-9)
    assert str(moved).splitlines()[0] == f"{configs[1].name}: 1 field(s) moved"
    assert "iteration.time_s: 2.76666666667 -> 3.3 (rel +1.928e-01)" in str(moved)
    assert str(mismatches[1]) == f"{configs[2].name}: stored but no longer configured (regenerate)"


def test_regenerate_command(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(digests, "api_report_function", lambda: fake_report)
    store = tmp_path / "d.json"
    argv = ["--configs", str(CONFIGS), "--digests", str(store)]
    assert digests.main([*argv, "--regenerate"]) == 0
    assert len(read_store(store)) == len(load_configs(CONFIGS))
    assert digests.main(argv) == 0
    monkeypatch.setattr(digests, "api_report_function", lambda: lambda c: {"other": c.name})
    assert digests.main(argv) == 1


def test_command_without_cost_model_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def missing() -> digests.ReportFunction:
        raise UnsupportedError("blueprinting.api cannot be imported (test)")

    monkeypatch.setattr(digests, "api_report_function", missing)
    assert digests.main(["--configs", str(CONFIGS)]) == 2
    assert "blueprinting.api cannot be imported" in capsys.readouterr().err


def test_bad_config_file_reports_every_problem(tmp_path: Path) -> None:
    bad = tmp_path / "c.toml"
    bad.write_text(
        '[[config]]\nname = "a"\nmodel = 3\nsystem = "s"\n[config.strategy]\nx = {a = 1}\n'
        '[[config]]\nname = "a"\nmodel = "m"\nsystem = "s"\n[config.strategy]\n'
        '[[config]]\nname = "b"\nmodel = "m"\nsystem = "s"\n[config.strategy]\n'
        '[[config]]\nname = "b"\nmodel = "m"\nsystem = "s"\n[config.strategy]\n',
        encoding="utf-8",
    )
    with pytest.raises(ConfigError) as info:
        load_configs(bad)
    assert info.value.problems == (
        "config[0].model must be a string",
        "config[0].strategy.x must be an integer, boolean, number or string",
        "duplicate config name 'b'",
    )


# --------------------------------------------------------------------------------------------
# The configuration list
# --------------------------------------------------------------------------------------------
# (layers, heads, query groups, seq) of the presets the configs name, for the divisibility
# checks below (Megatron-LM rules, shared/reference/megatron_rules.md).
PRESET_SHAPES = {
    "gpt-1.7b": (24, 24, 24, 2048),
    "megatron-22b": (48, 64, 64, 2048),
    "gpt3-175b": (96, 96, 96, 2048),
    "llama3-8b": (32, 32, 8, 8192),
    "llama2-70b": (80, 64, 8, 4096),
}
SYSTEMS = {"dgx-a100-80gb", "dgx-h100", "dgx-b200", "mi300x-8"}


def _int(keys: Mapping[str, object], key: str, default: int = 1) -> int:
    value = keys.get(key, default)
    assert type(value) is int
    return value


def test_configs_are_legal_megatron_strategies() -> None:
    configs = load_configs(CONFIGS)
    assert 28 <= len(configs) <= 34
    for config in configs:
        keys = config.strategy_keys
        layers, heads, groups, seq = PRESET_SHAPES[config.model]
        assert config.system in SYSTEMS
        t = _int(keys, "tensor_model_parallel_size")
        p = _int(keys, "pipeline_model_parallel_size")
        d = _int(keys, "data_parallel_size")
        v = _int(keys, "num_virtual_stages_per_pipeline_rank")
        mbs, gbs = _int(keys, "micro_batch_size"), _int(keys, "global_batch_size")
        assert heads % t == 0 and (groups % t == 0 or t % groups == 0), config.name
        assert layers % (p * v) == 0, config.name
        assert gbs % (mbs * d) == 0, config.name
        m = gbs // (mbs * d)
        if v > 1:
            assert p > 2 or keys.get("overlap_p2p_comm") is True, config.name
            group = _int(keys, "microbatch_group_size_per_vp_stage", p)
            assert p <= group <= m and m % group == 0, config.name
        if keys.get("sequence_parallel") is True:
            assert t > 1 and seq % t == 0, config.name
        if keys.get("recompute_granularity") == "full":
            assert 1 <= _int(keys, "recompute_num_layers") <= layers // p, config.name


def test_every_config_satisfies_the_laws() -> None:
    """The real adapter and laws (flat keys -> TrainingSpec -> every law), not a restatement:
    a config that violates a law would make its digest a digest of an error."""
    from blueprinting.api import build_spec
    from blueprinting.mapping.laws import check_training

    for config in load_configs(CONFIGS):
        spec = build_spec(model=config.model, settings=dict(config.strategy_keys))
        assert check_training(spec.model, spec.mapping) == (), config.name


def test_configs_cover_every_variant() -> None:
    configs = load_configs(CONFIGS)
    schedules, recomputes, shardings, flags = set(), set(), set(), set()
    for config in configs:
        keys = config.strategy_keys
        p = _int(keys, "pipeline_model_parallel_size")
        v = _int(keys, "num_virtual_stages_per_pipeline_rank")
        if p == 1:
            schedules.add("single")
        elif v == 1:
            schedules.add("1f1b")
        elif "microbatch_group_size_per_vp_stage" in keys:
            schedules.add("interleaved-group")
        else:
            schedules.add("interleaved-default")
        granularity = keys.get("recompute_granularity")
        recomputes.add(
            "none" if granularity is None else f"{granularity}-{keys.get('recompute_method', '')}"
        )
        if "data_parallel_sharding_strategy" in keys:
            shardings.add(str(keys["data_parallel_sharding_strategy"]))
        else:
            shardings.add("optim" if keys.get("use_distributed_optimizer") is True else "no_shard")
        flags |= {
            f"{flag}={keys.get(flag, False)}"
            for flag in ("sequence_parallel", "overlap_grad_reduce", "overlap_param_gather")
        }
        flags |= {"overlap_p2p_comm"} if keys.get("overlap_p2p_comm") is True else set()
    assert schedules == {"single", "1f1b", "interleaved-group", "interleaved-default"}
    assert recomputes == {"none", "selective-", "full-uniform", "full-block"}
    assert shardings == {"no_shard", "optim", "optim_grads", "optim_grads_params"}
    assert flags == {
        "sequence_parallel=True",
        "sequence_parallel=False",
        "overlap_grad_reduce=True",
        "overlap_grad_reduce=False",
        "overlap_param_gather=True",
        "overlap_param_gather=False",
        "overlap_p2p_comm",
    }
    assert {config.model for config in configs} == set(PRESET_SHAPES)
    assert {config.system for config in configs} == SYSTEMS


# --------------------------------------------------------------------------------------------
# The real digests
# --------------------------------------------------------------------------------------------
def test_stored_digests_match_the_cost_model() -> None:
    # No skip: a cost model that cannot be imported must fail this test, not hide as a skip.
    report = api_report_function()
    stored = read_store(DIGESTS)
    if not stored:
        pytest.fail(
            "tests/regression/digests.json is empty: run "
            "`python -m blueprinting.validation.digests --regenerate` and review the snapshots"
        )
    mismatches = check(stored, compute_entries(load_configs(CONFIGS), report))
    assert not mismatches, "\n".join(str(m) for m in mismatches)
