"""``blueprinting simulate`` (and ``plan --bubble``) on the GPT-3 175B example."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from blueprinting.cli.main import main

EXAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "gpt3-175b-selene.toml")
SIMULATION_KEYS = {
    "schedule",
    "megatron_refusals",
    "deadlock",
    "contract_comparison",
    "commands",
    "makespan_s",
    "pipeline_flush_s",
    "bubble_s",
    "busy_s_per_rank",
    "idle_s_per_rank",
    "comm_busy_s_per_rank",
    "peak_inflight_per_rank",
    "iteration_time_s",
    "iteration_terms_s",
    "plan_difference_s",
    "plan_difference_terms_s",
    "plan_difference_reasons",
}


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    assert main(["simulate", EXAMPLE, "--json", *argv]) == 0
    values = json.loads(capsys.readouterr().out)
    assert isinstance(values, dict)
    return values


def test_json_has_plan_and_simulation(capsys: pytest.CaptureFixture[str]) -> None:
    values = _json(capsys)
    assert values["microbatch_count"] == 96
    bubble = values["bubble"]
    assert isinstance(bubble, dict)
    assert bubble["used"] == "simulated"
    assert isinstance(bubble["simulated_s"], float)
    simulation = values["simulation"]
    assert isinstance(simulation, dict)
    assert set(simulation) == SIMULATION_KEYS
    assert simulation["deadlock"] is None
    assert simulation["megatron_refusals"] == []
    assert simulation["schedule"] == "1F1B x3"
    assert simulation["peak_inflight_per_rank"] == [31, 29, 27, 25, 23, 21, 19, 17]
    busy = simulation["busy_s_per_rank"]
    assert isinstance(busy, list)
    assert len(busy) == 8
    makespan, flush = simulation["makespan_s"], simulation["pipeline_flush_s"]
    assert isinstance(makespan, float)
    assert isinstance(flush, float)
    assert makespan > flush > max(busy)
    comparison = simulation["contract_comparison"]
    assert isinstance(comparison, dict)
    assert comparison["simulated_s"] == bubble["simulated_s"]
    assert comparison["contract_s"] == bubble["contract_s"]
    assert comparison["extra_interleaving_chunks"] == 0


def test_set_works_as_in_plan(capsys: pytest.CaptureFixture[str]) -> None:
    values = _json(capsys, "--set", "global_batch_size=768")
    assert values["microbatch_count"] == 48
    simulation = values["simulation"]
    assert isinstance(simulation, dict)
    # 48 microbatches through p v = 8 x 3 = 24 virtual stages: 24 x 48 = 1152 forward and 1152
    # backward passes (2304 compute commands), plus sends (simulator/commands.py).
    commands = simulation["commands"]
    assert isinstance(commands, int)
    assert commands > 2 * 8 * 3 * 48
    # Sends: every virtual stage but the last sends each forward on, every one but the first
    # each input gradient back: 2 x (24 - 1) x 48 = 2208. DP buckets (d = 16 > 1): one per
    # model chunk per rank, 24. Total 2304 + 2208 + 24 = 4536.
    p, v, m = 8, 3, 48
    expected = 2 * p * v * m + 2 * (p * v - 1) * m + p * v
    assert expected == 4536
    assert commands == expected


def test_legal_group_size_shows_the_contract_overestimate(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """m = 97, N = 97: Megatron runs it; the contract adds (v-1)(p - m mod p) = 14 chunks."""
    values = _json(
        capsys, "--set", "global_batch_size=1552", "--set", "microbatch_group_size_per_vp_stage=97"
    )
    simulation = values["simulation"]
    assert isinstance(simulation, dict)
    comparison = simulation["contract_comparison"]
    assert isinstance(comparison, dict)
    assert comparison["extra_interleaving_chunks"] == 14
    difference, term = comparison["difference_s"], comparison["interleaving_term_s"]
    assert isinstance(difference, float)
    assert isinstance(term, float)
    assert difference > 0.5 * term > 0.0
    explanation = comparison["explanation"]
    assert isinstance(explanation, list)
    assert str(explanation[0]).startswith(
        "the contract adds (v-1)(p - m mod p) = (3-1)(8 - 1) = 14 chunks"
    )


def test_refused_schedule_deadlock_is_reported(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", EXAMPLE, "--json", "--no-megatron-rules"]
    assert main([*argv, "--set", "global_batch_size=1552"]) == 1
    values = json.loads(capsys.readouterr().out)
    simulation = values["simulation"]
    assert simulation["megatron_refusals"] == [
        "m % N = 1 introduces dependency bubbles (needs 0 or >= p = 8)"
    ]
    assert simulation["deadlock"][0] == "rank 0 F96.2"
    assert simulation["makespan_s"] is None
    assert values["bubble"]["used"] == "contract"


def test_trace_has_one_event_per_command(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    trace = tmp_path / "trace.json"
    values = _json(capsys, "--trace", str(trace))
    simulation = values["simulation"]
    assert isinstance(simulation, dict)
    document = json.loads(trace.read_text())
    events = document["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    assert len(complete) == simulation["commands"]
    assert len({e["args"]["command"] for e in complete}) == len(complete)
    processes = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert processes == {r: f"rank {r}" for r in range(8)}
    threads = {(e["pid"], e["tid"]) for e in events if e["name"] == "thread_name"}
    assert threads == {(r, t) for r in range(8) for t in (0, 1)}
    assert all(e["dur"] >= 0.0 and e["ts"] >= 0.0 for e in complete)
    makespan = simulation["makespan_s"]
    assert isinstance(makespan, float)
    assert max(e["ts"] + e["dur"] for e in complete) == pytest.approx(makespan * 1e6, rel=1e-12)


def test_plot_writes_png(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    picture = tmp_path / "timeline.png"
    assert (
        main(["simulate", EXAMPLE, "--set", "global_batch_size=256", "--plot", str(picture)]) == 0
    )
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = capsys.readouterr().out
    assert "contract - simulated" in text
    assert "peak in-flight" in text


def test_plot_needs_png_or_svg(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", EXAMPLE, "--plot", "out.pdf"]) == 2
    assert "must end in .png or .svg" in capsys.readouterr().err


@pytest.mark.parametrize("source", ["contract", "simulated"])
def test_plan_bubble_option(capsys: pytest.CaptureFixture[str], source: str) -> None:
    assert main(["plan", EXAMPLE, "--json", "--bubble", source]) == 0
    values = json.loads(capsys.readouterr().out)
    assert values["bubble"]["used"] == source
    assert isinstance(values["bubble"]["simulated_s"], float)
    chosen = values["bubble"]["contract_s" if source == "contract" else "simulated_s"]
    assert values["time_breakdown_s"]["pipeline_bubble"] == chosen


def test_plan_defaults_to_simulated(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", EXAMPLE, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["bubble"]["used"] == "simulated"


def test_plan_and_simulate_agree_on_the_iteration_time(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The README example (GPT-3 175B, TP8 PP8 v3 DP16, distributed optimizer): the simulation
    runs compute, P2P and the gradient reduce-scatter; the parameter all-gather and the Adam step
    are added as the plan computes them, and what is left is the DP gradient reduction composed
    per critical stage (plan) against per rank (simulation), named with its reason."""
    values = _json(capsys)
    simulation = values["simulation"]
    assert isinstance(simulation, dict)
    plan_s = values["iteration_time_s"]
    simulated_s = simulation["iteration_time_s"]
    assert isinstance(plan_s, float) and isinstance(simulated_s, float)
    assert abs(plan_s - simulated_s) / plan_s < 0.005
    assert plan_s == pytest.approx(18.66104, abs=5e-5)
    assert simulated_s == pytest.approx(18.66497, abs=5e-5)
    terms = simulation["iteration_terms_s"]
    assert isinstance(terms, dict)
    assert terms["makespan"] == simulation["makespan_s"]
    # Distributed optimizer: all-gather of the bf16 parameters (1/3 of the 0.6557 s of DP
    # traffic, the reduce-scatter of fp32 gradients the other 2/3), exposed without overlap.
    assert terms["param_gather_exposed"] == pytest.approx(0.21858, abs=1e-5)
    assert simulated_s == pytest.approx(sum(terms.values()), rel=1e-15)
    split = simulation["plan_difference_terms_s"]
    assert isinstance(split, dict)
    assert split["pipeline"] == pytest.approx(0.0, abs=1e-9)
    assert split["dp_grad_sync"] == pytest.approx(simulation["plan_difference_s"], abs=1e-9)
    assert split["dp_grad_sync"] == pytest.approx(-0.00393, abs=1e-5)
    reasons = simulation["plan_difference_reasons"]
    assert isinstance(reasons, list) and len(reasons) == 1
    assert str(reasons[0]).startswith("dp_grad_sync -0.00392832 s: the plan charges")


def test_the_hidden_dp_collectives_sms_are_their_own_difference_term(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Llama 3 70B on 64 H100 (t4 p2, distributed optimizer with both overlaps): the plan charges
    the compute its hidden DP collectives slow (24 of 132 SMs: 24/108 of the hidden 0.474 s);
    the simulation does not model it, so it is a term of its own and the terms still sum."""
    argv = [
        "simulate",
        "--model",
        "llama3-70b",
        "--system",
        "dgx-h100",
        "--gpus",
        "64",
        *("--set", "tensor_model_parallel_size=4", "--set", "pipeline_model_parallel_size=2"),
        *("--set", "global_batch_size=128", "--set", "use_distributed_optimizer=true"),
        *("--set", "overlap_grad_reduce=true", "--set", "overlap_param_gather=true"),
        "--json",
    ]
    assert main(argv) == 0
    values = json.loads(capsys.readouterr().out)
    dp, simulation = values["dp_comm"], values["simulation"]
    hidden = dp["link_s"] - (dp["exposed_s"] - dp["sm_contention_s"])
    assert dp["sm_contention_s"] == pytest.approx(24 / 108 * hidden, rel=1e-12)
    split = simulation["plan_difference_terms_s"]
    assert split["dp_sm_contention"] == dp["sm_contention_s"] > 0.1
    assert sum(split.values()) == pytest.approx(simulation["plan_difference_s"], abs=1e-12)
    reasons = simulation["plan_difference_reasons"]
    assert any(str(r).startswith("dp_sm_contention +0.105") for r in reasons)
