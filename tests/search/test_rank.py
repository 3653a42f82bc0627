"""Ranking, the Pareto front, the standing of a strategy (why not) and the search CLI."""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest

from blueprinting.cli.main import main
from blueprinting.hardware.presets import system_preset
from blueprinting.mapping.law_names import Law
from blueprinting.mapping.presets import model_preset
from blueprinting.mapping.transformer import TrainingSpec
from blueprinting.search.rank import (
    MEMORY_REASON,
    PARAM_GATHER_LAW,
    ExcludedByLaw,
    ExcludedByMemory,
    Objective,
    Ranked,
    RankOptions,
    SearchResult,
    exact_reports,
    pareto_front,
    ranking_order,
    run_search,
    standing,
)
from blueprinting.search.space import SearchSpace, candidate_to_spec
from blueprinting.search.strategy_text import format_strategy_text, parse_strategy_text


@pytest.fixture(scope="module")
def result() -> SearchResult:
    return run_search(
        model_preset("gpt-7.5b"),
        system_preset("dgx-a100-40gb"),
        SearchSpace(gpu_counts=(32,), global_batch_size=64, max_microbatch_size=4),
    )


def test_ranking_order_is_stable_and_filters() -> None:
    score = np.array([3.0, 1.0, 2.0, 1.0, 0.5])
    eligible = np.array([True, True, True, True, False])
    assert ranking_order(score, eligible).tolist() == [1, 3, 2, 0]


def test_pareto_front_against_brute_force() -> None:
    rng = np.random.default_rng(7)
    time_s = rng.integers(1, 20, 300).astype(np.float64)
    memory = rng.integers(1, 20, 300).astype(np.int64)
    eligible = rng.random(300) < 0.8
    front = set(pareto_front(time_s, memory, eligible).tolist())
    rows = np.flatnonzero(eligible)
    for i in rows:
        dominated = any(
            (time_s[j] <= time_s[i] and memory[j] <= memory[i])
            and (time_s[j] < time_s[i] or memory[j] < memory[i])
            for j in rows
        )
        if dominated:
            assert i not in front
    # Of undominated rows, exactly one per distinct (time, memory) pair is on the front.
    undominated = {
        (time_s[i], memory[i])
        for i in rows
        if not any(
            (time_s[j] <= time_s[i] and memory[j] <= memory[i])
            and (time_s[j] < time_s[i] or memory[j] < memory[i])
            for j in rows
        )
    }
    assert {(time_s[i], memory[i]) for i in front} == undominated
    assert len(front) == len(undominated)


def test_search_ranks_fitting_candidates_by_time(result: SearchResult) -> None:
    times = result.figures.iteration_time_s[result.order]
    assert np.all(np.diff(times) >= 0)
    assert np.all(result.fits[result.order])
    assert result.candidates_fit == int(result.fits.sum())
    rejections = result.rejections()
    assert rejections[MEMORY_REASON] + result.candidates_fit == result.candidates_valid
    # Megatron's overlap_param_gather rule is applied by the enumeration: nothing evaluated
    # breaks it, and what it refused is counted there.
    assert result.candidates_valid == len(result.table)
    table = result.table
    assert not np.any(table.overlap_param_gather & ~table.overlap_grad_reduce)
    assert np.any(table.overlap_param_gather)
    assert rejections[PARAM_GATHER_LAW] == result.enumeration.rejected(
        Law.MEGATRON_OVERLAP_PARAM_GATHER
    )
    assert rejections[PARAM_GATHER_LAW] > 0
    # The listed strategies re-plan exactly (exact_reports raises otherwise).
    reports = exact_reports(result, result.order[:5])
    assert [r.iteration_time_s for r in reports] == pytest.approx(times[:5].tolist(), rel=1e-9)


def test_gpu_hours_objective_orders_by_cost() -> None:
    found = run_search(
        model_preset("gpt-1.7b"),
        system_preset("dgx-a100-80gb"),
        SearchSpace(gpu_counts=(8, 16), global_batch_size=32, max_microbatch_size=2),
        RankOptions(objective=Objective.GPU_HOURS, train_tokens=10**9),
    )
    f = found.figures
    iterations = -(-(10**9) // f.tokens_per_iteration)
    cost = iterations * f.iteration_time_s * f.world_size / 3600
    assert np.all(np.diff(cost[found.order]) >= 0)
    assert set(f.world_size[found.order].tolist()) == {8, 16}


def _spec(result: SearchResult, text: str) -> TrainingSpec:
    mapping = parse_strategy_text(text, global_batch_size=64, num_gpus=32)
    return TrainingSpec(model=result.model, mapping=mapping)


def test_standing_of_a_law_rejected_strategy(result: SearchResult) -> None:
    got = standing(result, _spec(result, "tp=8 pp=5 dp=1"))
    assert isinstance(got, ExcludedByLaw)
    assert "blocks_per_pipeline_stage" in {v.law for v in got.violations}


def test_standing_of_a_memory_rejected_strategy(result: SearchResult) -> None:
    got = standing(result, _spec(result, "tp=1 pp=1 mbs=2"))
    assert isinstance(got, ExcludedByMemory)
    # NVML's total of an A100 40GB less the driver's reserve (presets.DRIVER_RESERVED_MIB)
    assert got.total_bytes > got.limit_bytes == (40_960 - 620) * 2**20


def test_standing_of_a_ranked_strategy(result: SearchResult) -> None:
    best = int(result.order[0])
    third = int(result.order[2])
    text = format_strategy_text(candidate_to_spec(result.table, third, result.model).mapping)
    got = standing(result, _spec(result, text))
    assert isinstance(got, Ranked)
    assert got.row == third
    assert got.rank == 3
    assert got.best_score == float(result.figures.iteration_time_s[best])
    assert got.gap >= 0


ARGS = ["search", "--model", "gpt-1.7b", "--gpus", "8", "--global-batch", "16"]


def test_cli_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*ARGS, "--top", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) >= {
        "candidates_enumerated",
        "candidates_valid",
        "candidates_fit",
        "rejections",
        "seconds",
        "ranked",
    }
    assert out["bubble_source"] == "contract"
    assert [r["rank"] for r in out["ranked"]] == [1, 2, 3]
    times = [r["iteration_time_s"] for r in out["ranked"]]
    assert times == sorted(times)
    assert out["ranked"][0]["megatron_args"][0] == "--tensor-model-parallel-size"
    assert out["ranked"][0]["bubble"]["used"] == "contract"


def test_cli_csv(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*ARGS, "--csv", "-"]) == 0
    rows = list(csv.reader(io.StringIO(capsys.readouterr().out)))
    assert rows[0][:3] == ["rank", "strategy", "world_size"]
    assert [int(r[0]) for r in rows[1:4]] == [1, 2, 3]
    assert len(rows) > 100


def test_cli_explain_and_text(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*ARGS, "--explain", "tp=8 pp=5 dp=1"]) == 0
    assert "excluded by" in capsys.readouterr().out
    assert main([*ARGS, "--top", "2"]) == 0
    text = capsys.readouterr().out
    assert "bubble: the seed's contract" in text
    assert "Megatron-LM flags:" in text
    assert "#2: --tensor-model-parallel-size" in text


def test_cli_explain_text_is_refused_before_the_search(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``--explain`` text the parser refuses exits 2 without running the search (fuzz seed
    1202 cases 14570 and 2259 searched for 10-14 s of CPU before refusing theirs)."""
    import blueprinting.cli.search as search_cli

    def no_search(*_: object) -> None:
        raise AssertionError("the search ran before the --explain text was checked")

    monkeypatch.setattr(search_cli, "_result", no_search)
    assert main([*ARGS, "--explain", "tp=8 pp=sometimes"]) == 2
    assert "pp" in capsys.readouterr().err


def test_cli_bad_input_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*ARGS, "--top", "-1"]) == 2
    assert "--top must be >= 0" in capsys.readouterr().err


def test_cli_tp_comm_overlap(capsys: pytest.CaptureFixture[str]) -> None:
    """--tp-comm-overlap both adds the overlapped twin of every lawful sequence-parallel
    strategy with t > 1; on replaces it; the rejection counts name both userbuffer laws."""
    counts = {}
    for mode in ("off", "both", "on"):
        assert main([*ARGS, "--top", "1", "--json", "--tp-comm-overlap", mode]) == 0
        out = json.loads(capsys.readouterr().out)
        counts[mode] = out["candidates_valid"]
        assert out["rejections"]["tp_comm_overlap_needs_sequence_parallel"] == 0
        assert out["rejections"]["tp_comm_overlap_buffer_shape"] == 0
    assert counts["on"] == counts["off"] < counts["both"]
    assert main([*ARGS, "--tp-comm-overlap", "on", "--csv", "-"]) == 0
    strategies = [r[1] for r in csv.reader(io.StringIO(capsys.readouterr().out))][1:]
    overlapped = [s for s in strategies if "tp_overlap=on" in s]
    assert overlapped
    assert all("sp=on" in s and "tp=1 " not in s for s in overlapped)
    assert all("tp_overlap=on" in s for s in strategies if "sp=on" in s)
    assert main([*ARGS, "--tp-comm-overlap", "on", "--top", "1", "--explain", overlapped[0]]) == 0
    assert "rank " in capsys.readouterr().out
    assert main([*ARGS, "--top", "1", "--explain", overlapped[0]]) == 0
    assert "legal, but not in the searched space" in capsys.readouterr().out
    assert main([*ARGS, "--tp-comm-overlap", "bth"]) == 2
    assert "--tp-comm-overlap: 'bth' is not one of off, on, both (did you mean 'both'?)" in (
        capsys.readouterr().err
    )


def test_a_recipe_the_accelerator_cannot_run_refuses_the_search() -> None:
    from blueprinting.errors import InvalidStrategyError
    from blueprinting.mapping.precision import Fp4Precision, Fp8Precision, Fp8Recipe

    space = SearchSpace(
        gpu_counts=(8,),
        global_batch_size=8,
        precision=(Fp8Precision(recipe=Fp8Recipe.MXFP8), Fp4Precision()),
    )
    with pytest.raises(InvalidStrategyError) as error:
        run_search(model_preset("llama3-8b"), system_preset("dgx-h100"), space)
    assert [v.law for v in error.value.violations] == ["precision_recipe_accelerator"] * 2


def test_explain_finds_the_row_of_its_cp_axis_and_recipe() -> None:
    from blueprinting.mapping.precision import Fp8Precision, Fp8Recipe, HighPrecision
    from blueprinting.mapping.transformer import CpCommType
    from blueprinting.search.rank import find_row
    from blueprinting.search.strategy_text import parse_strategy_text

    fp8 = Fp8Precision(recipe=Fp8Recipe.TENSORWISE)
    space = SearchSpace(
        gpu_counts=(16,),
        global_batch_size=8,
        max_microbatch_size=1,
        context_parallel=(1, 2),
        cp_comm_types=(CpCommType.P2P, CpCommType.A2A),
        precision=(HighPrecision(), fp8),
    )
    result = run_search(model_preset("llama3-8b"), system_preset("dgx-h100"), space)
    for text in (
        "tp=2 cp=2 cp_comm=a2a pp=1 mbs=1 sp=on recompute=none precision=fp8-tensorwise",
        "tp=2 cp=2 pp=1 mbs=1 sp=on recompute=none",
        "tp=2 pp=1 mbs=1 sp=on recompute=none precision=fp8-tensorwise",
    ):
        mapping = parse_strategy_text(text, global_batch_size=8, num_gpus=16)
        row = find_row(result.table, mapping)
        assert row is not None, text
        assert candidate_to_spec(result.table, row, result.model).mapping == mapping, text


def test_a_search_beyond_the_bound_says_so_up_front(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 18: a space of more block configurations than the time bound covers is streamed,
    and the search names their number on stderr before it costs the first (here with the
    bound lowered, so that a small space crosses it); each configuration is costed once."""
    from blueprinting import limits
    from blueprinting.search import evaluate_vectorized

    assert main([*ARGS, "--json"]) == 0
    assert capsys.readouterr().err == ""  # within the bound: nothing said
    costed: list[object] = []
    seen_before_costing: list[str] = []
    plan = evaluate_vectorized.portable_plan  # type: ignore[attr-defined]

    def counted(*args: object, **kwargs: object) -> object:
        if not costed:
            seen_before_costing.append(capsys.readouterr().err)
        costed.append(args[0])
        return plan(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(evaluate_vectorized, "portable_plan", counted)
    monkeypatch.setattr(limits, "SEARCH_BLOCKS_WITHIN_BOUND", 3)
    assert main([*ARGS, "--json"]) == 0
    assert capsys.readouterr().err == ""  # said once, before the first costing
    n = len(costed)
    assert n > 3
    assert seen_before_costing == [
        f"search: costing {n:,} block configurations, more than the 3 within the 5 s time "
        f"bound (SEARCH_BLOCKS_WITHIN_BOUND): allow {0.004 * (n - 3):.1f} s more of CPU\n"
    ]
    # --csv says so too, before it writes, when it writes more rows than the bound covers
    monkeypatch.setattr(limits, "SEARCH_BLOCKS_WITHIN_BOUND", 800)
    monkeypatch.setattr(limits, "SEARCH_CSV_ROWS_WITHIN_BOUND", 10)
    assert main([*ARGS, "--csv", "-"]) == 0
    captured = capsys.readouterr()
    rows = captured.out.count("\n") - 1  # the header
    assert rows > 10
    assert captured.err == (
        f"search: writing {rows:,} CSV rows, more than the 10 within the 5 s time bound "
        f"(SEARCH_CSV_ROWS_WITHIN_BOUND): allow {4e-5 * (rows - 10):.1f} s more of CPU\n"
    )
    # and a space of more lawful candidates than the bound covers, before it evaluates them
    monkeypatch.setattr(limits, "SEARCH_CSV_ROWS_WITHIN_BOUND", 20_000)
    monkeypatch.setattr(limits, "SEARCH_CANDIDATES_WITHIN_BOUND", 5)
    costed.clear()
    seen_before_costing.clear()
    assert main([*ARGS, "--json"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    lawful = json.loads(captured.out)["candidates_valid"]
    assert lawful == 3084
    assert seen_before_costing == [
        f"search: evaluating {lawful:,} candidates, more than the 5 within the 5 s time bound "
        f"(SEARCH_CANDIDATES_WITHIN_BOUND): allow {2.5e-5 * (lawful - 5):.1f} s more of CPU\n"
    ]
    # both beyond their bounds: the candidates first (counted before any is evaluated), then
    # the block configurations, each once
    monkeypatch.setattr(limits, "SEARCH_BLOCKS_WITHIN_BOUND", 3)
    costed.clear()
    seen_before_costing.clear()
    assert main([*ARGS, "--json"]) == 0
    assert capsys.readouterr().err == ""
    assert seen_before_costing == [
        f"search: evaluating {lawful:,} candidates, more than the 5 within the 5 s time bound "
        f"(SEARCH_CANDIDATES_WITHIN_BOUND): allow {2.5e-5 * (lawful - 5):.1f} s more of CPU\n"
        f"search: costing {n:,} block configurations, more than the 3 within the 5 s time "
        f"bound (SEARCH_BLOCKS_WITHIN_BOUND): allow {0.004 * (n - 3):.1f} s more of CPU\n"
    ]


def test_the_streamed_search_allowance() -> None:
    from blueprinting.limits import (
        search_blocks_notice,
        search_candidates_notice,
        search_csv_notice,
    )
    from tests.fuzz.cli_cases import streamed_allowance

    assert search_blocks_notice(800) is None
    assert search_csv_notice(20_000) is None
    blocks = search_blocks_notice(6858)
    assert blocks == (
        "search: costing 6,858 block configurations, more than the 800 within the 5 s time "
        "bound (SEARCH_BLOCKS_WITHIN_BOUND): allow 24.2 s more of CPU"
    )
    rows = search_csv_notice(80_326)
    assert rows == (
        "search: writing 80,326 CSV rows, more than the 20,000 within the 5 s time bound "
        "(SEARCH_CSV_ROWS_WITHIN_BOUND): allow 2.4 s more of CPU"
    )
    assert search_candidates_notice(90_000) is None
    candidates = search_candidates_notice(113_214)
    assert candidates == (
        "search: evaluating 113,214 candidates, more than the 90,000 within the 5 s time bound "
        "(SEARCH_CANDIDATES_WITHIN_BOUND): allow 0.6 s more of CPU"
    )
    # the fuzz harness reads the notices back: its bound stretches by what they state
    assert streamed_allowance(f"other line\n{blocks}\n") == pytest.approx(24.2)
    assert streamed_allowance(f"{blocks}\n{rows}\n") == pytest.approx(26.6)
    assert streamed_allowance(f"{candidates}\n{blocks}\n") == pytest.approx(24.8)
    assert streamed_allowance("search: costing blocks") == 0.0


def test_cli_balanced_layouts_search_deepseek_v3_pipelines(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """DeepSeek-V3's 61 layers split evenly over no pipeline degree a 256-GPU search tries, so
    the even search ranks PP 1 only; with balanced layouts the best strategy pipelines, planned
    with its layout, and the flags print it shell-quoted."""
    args = [
        "search",
        "--model",
        "deepseek-v3",
        "--system",
        "dgx-gb200",
        "--gpus",
        "256",
        "--global-batch",
        "2048",
        "--max-micro-batch",
        "1",
        "--top",
        "3",
    ]
    assert main([*args, "--json"]) == 0
    even = json.loads(capsys.readouterr().out)
    assert {r["strategy"]["pipeline_model_parallel_size"] for r in even["ranked"]} == {1}
    assert main([*args, "--json", "--pipeline-layouts", "balanced"]) == 0
    balanced = json.loads(capsys.readouterr().out)
    best = balanced["ranked"][0]
    assert best["strategy"]["pipeline_model_parallel_size"] > 1
    layout = best["strategy"]["pipeline_model_parallel_layout"]
    assert layout.startswith("E") and layout.endswith("mL")  # the MTP depth with the loss
    assert best["iteration_time_s"] < even["ranked"][0]["iteration_time_s"]
    assert balanced["candidates_valid"] > even["candidates_valid"]
    assert main(args) == 0
    assert "--pipeline-layouts balanced searches those" in capsys.readouterr().out
    assert main([*args, "--pipeline-layouts", "balanced"]) == 0
    text = capsys.readouterr().out
    assert "--pipeline-layouts balanced searches those" not in text
    assert f"--pipeline-model-parallel-layout '{layout}'" in text
    assert "--moe-layer-freq '([0]*3+[1]*58)'" in text
    with pytest.raises(SystemExit) as refused:
        main([*args, "--pipeline-layouts", "uneven"])
    assert refused.value.code == 2


def test_explain_a_layout_the_search_does_not_plan_for_its_p_and_v() -> None:
    """A strategy whose (p, v) is a row but whose layout is not the row's (the balanced one
    under --pipeline-layouts balanced) is another strategy: not in the space, said so."""
    from dataclasses import replace

    from blueprinting.mapping.pipeline_layout import parse_pipeline_layout
    from blueprinting.mapping.transformer import FlexibleStages
    from blueprinting.search.rank import NotInSpace
    from blueprinting.search.space import PipelineLayouts

    model = model_preset("deepseek-v2-lite")
    result = run_search(
        model,
        system_preset("dgx-h100"),
        SearchSpace(
            gpu_counts=(16,),
            global_batch_size=32,
            max_microbatch_size=1,
            pipeline_layouts=PipelineLayouts.BALANCED,
        ),
    )
    uneven = [
        int(i)
        for i in result.order
        if model.num_layers % int(result.table.pipeline[i] * result.table.virtual_stages[i])
    ]
    assert uneven, "the balanced space ranks layouts"
    spec = candidate_to_spec(result.table, uneven[0], model)
    assert isinstance(standing(result, spec), Ranked)
    pipeline = spec.mapping.parallelism.pipeline
    layout = pipeline.layout
    assert isinstance(layout, FlexibleStages)
    stages = layout.stages
    # move one block from the first stage holding two or more to the last stage
    k = next(i for i, s in enumerate(stages) if s.decoder_layers >= 2)
    moved = list(stages)
    moved[k] = replace(stages[k], decoder_layers=stages[k].decoder_layers - 1)
    moved[-1] = replace(stages[-1], decoder_layers=stages[-1].decoder_layers + 1)
    other = replace(pipeline, layout=FlexibleStages(stages=tuple(moved)))
    assert other.layout == parse_pipeline_layout(str(other.layout)[len("layout(") : -1])
    parallelism = replace(spec.mapping.parallelism, pipeline=other)
    elsewhere = replace(spec, mapping=replace(spec.mapping, parallelism=parallelism))
    assert standing(result, elsewhere) == NotInSpace(layout_differs=True)
