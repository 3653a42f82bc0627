"""Every command answers every input form with exit 0, 1 or 2 and a message, never a traceback,
within a time bound (issue #18).

The cases come from ``tests/fuzz/cli_cases.py`` driven by hypothesis's random source, so a
failure shrinks and replays. Each form gets a modest number of examples (the whole module stays
well under a minute on two cores); ``benchmarks/fuzz_cli.py`` runs 10**5 cases. Two cases run
as subprocesses to prove that nothing reaches stderr as a traceback outside the in-process
harness either. The limits the messages name are checked with exact texts.
"""

from __future__ import annotations

import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blueprinting.limits import MAX_INT, MAX_SEARCH_ROWS, MAX_YAML_NODES
from tests.fuzz.cli_cases import (
    EXAMPLES,
    FORMS,
    SERVING_FILE,
    Case,
    alias_bomb,
    draw_case,
    problems_of,
    run_case,
)

#: The CPU-time bound of one case in the suite (this process's CPU time, which other work on a
#: shared machine does not inflate), generous for a slow CI core: an infer search over
#: 100,000 replicas takes about 3.6 s; the README's bound is 5 s (``validate`` on the full
#: fixtures and the largest MoE / CP searches pass it, not run here).
#: ``benchmarks/fuzz_cli.py`` reports the slowest case of a long run.
CASE_SECONDS = 15.0
#: The wall-time bound of one case: a hang, whatever the machine's load.
WALL_SECONDS = 120.0

_FUZZ = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def _check(case: Case, folder: Path) -> None:
    outcome = run_case(case, folder)
    problems = problems_of(case, outcome, max_seconds=WALL_SECONDS, max_cpu_seconds=CASE_SECONDS)
    assert not problems, f"{case}\n" + "\n".join(problems) + f"\nstderr:\n{outcome.err[-2000:]}"


@pytest.mark.parametrize(
    "form",
    ["flat", "set", "toml", "json", "yaml", "hf", "explain", "fixture", "sweep"],
)
@_FUZZ
@given(rng=st.randoms(use_true_random=False))
def test_every_input_form_gets_an_answer(
    form: str, rng: random.Random, tmp_path_factory: pytest.TempPathFactory
) -> None:
    _check(draw_case(rng, form), tmp_path_factory.mktemp(form))


@pytest.mark.parametrize("form", ["search", "infer", "html", "presets"])
@settings(_FUZZ, max_examples=6)
@given(rng=st.randoms(use_true_random=False))
def test_search_and_infer_options_get_an_answer(
    form: str, rng: random.Random, tmp_path_factory: pytest.TempPathFactory
) -> None:
    _check(draw_case(rng, form), tmp_path_factory.mktemp(form))


def _answer(tmp_path: Path, *argv: str, files: tuple[tuple[str, str], ...] = ()) -> tuple[int, str]:
    outcome = run_case(Case("direct", argv, files), tmp_path)
    assert outcome.crash is None, outcome.crash
    assert outcome.cpu_seconds < CASE_SECONDS, f"{argv}: {outcome.cpu_seconds:.1f} s of CPU"
    return outcome.code, outcome.err


def test_search_on_99999999999_gpus_answers_at_once(tmp_path: Path) -> None:
    """The issue's first report: a minute of trial division, now the laws' answer in a second:
    99,999,999,999 = 3^2 x 21,649 x 513,239, so d divides 1536 only for d in {1, 3}, and then
    t x p >= 33,333,333,333 > 96 layers."""
    start = time.process_time()
    code, err = _answer(
        tmp_path,
        "search",
        "--model",
        "gpt3-175b",
        "--system",
        "dgx-a100-80gb",
        "--gpus",
        "99999999999",
        "--global-batch",
        "1536",
    )
    assert time.process_time() - start < CASE_SECONDS
    assert code == 2
    assert err.startswith("error: search: no candidate of the space satisfies the laws")


def test_search_refuses_a_space_beyond_its_stated_size(tmp_path: Path) -> None:
    # 9,316,358,251,200 has 10,752 divisors.
    code, err = _answer(
        tmp_path,
        "search",
        "--model",
        "gpt3-175b",
        "--gpus",
        "9316358251200",
        "--global-batch",
        "1536",
    )
    assert code == 2
    assert err == (
        "invalid configuration in search space:\n"
        "  - search space too large: law-relevant rows (GPU counts x t x p x v x micro-batch x sp "
        f"x recompute) = 182,476,800 exceeds the limit of {MAX_SEARCH_ROWS:,}; search fewer GPU "
        "counts, cap --max-micro-batch, or choose a GPU count or global batch with fewer "
        "divisors\n"
    )


def test_integers_beyond_int64_are_refused_naming_the_limit(tmp_path: Path) -> None:
    code, err = _answer(
        tmp_path,
        "check",
        str(EXAMPLES / "gpt3-175b-selene.toml"),
        "--set",
        f"world_size={MAX_INT + 1}",
    )
    assert code == 2
    assert (
        "  - world_size must be a positive integer at most 2**63 - 1 = 9223372036854775807, "
        "got 9223372036854775808\n"
    ) in err


def test_a_wrong_batch_size_is_one_message_not_two(tmp_path: Path) -> None:
    code, err = _answer(tmp_path, "infer", str(EXAMPLES / SERVING_FILE), "--set", "batch_size=0")
    assert code == 2
    assert err == (
        f"invalid configuration in {EXAMPLES / SERVING_FILE}:\n"
        "  - batch_size must be a positive integer, got 0\n"
    )


def test_a_yaml_alias_bomb_is_refused_quickly(tmp_path: Path) -> None:
    """9**9 = 387,420,489 strings from 400 bytes of YAML."""
    code, err = _answer(tmp_path, "check", "{dir}/bomb.yaml", files=(("bomb.yaml", alias_bomb()),))
    assert code == 2
    assert err == (
        f"invalid configuration in {tmp_path}/bomb.yaml:\n"
        f"  - yaml document expands to more than {MAX_YAML_NODES:,} nodes (MAX_YAML_NODES; "
        "aliases counted at every use)\n"
    )


def test_yaml_loading_is_safe(tmp_path: Path) -> None:
    text = "model: !!python/object/apply:os.system ['echo pwned']\n"
    code, err = _answer(tmp_path, "check", "{dir}/evil.yaml", files=(("evil.yaml", text),))
    assert code == 2
    assert "malformed yaml: could not determine a constructor for the tag" in err


def test_deep_json_is_refused(tmp_path: Path) -> None:
    code, err = _answer(tmp_path, "plan", "{dir}/deep.json", files=(("deep.json", "[" * 100_000),))
    assert code == 2
    assert "malformed json: nested too deeply (more than 64 levels are refused)" in err


def test_simulate_on_a_huge_data_degree_answers(tmp_path: Path) -> None:
    """Placing the DP group used to visit every rank of the world."""
    code, _ = _answer(tmp_path, "simulate", "--model", "gpt-1.7b", "--gpus", "8084761684372711889")
    assert code in (0, 1)


def test_infer_search_work_does_not_grow_with_replicas(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """45 s with 100,000 replicas before issue #18 (1.3 s with 4): the layouts are bounded by
    the divisors of the GPUs per node and of the layer count (40 here: every one is admissible
    on 800,000 GPUs and on 8 x 10**15), and decode attention is costed once per (t, batch) for
    every layout. The bound is twice a case's: this is the heaviest case of the suite."""
    import blueprinting.inference.search as inference_search

    calls: list[int] = []
    real = inference_search.analyze_inference  # type: ignore[attr-defined]

    def counted(*args: object, **kwargs: object) -> object:
        calls.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(inference_search, "analyze_inference", counted)
    counts = []
    for replicas in (100_000, 10**15):
        start = time.process_time()
        outcome = run_case(
            Case(
                "direct",
                (
                    "infer",
                    str(EXAMPLES / SERVING_FILE),
                    "--search",
                    "--set",
                    f"replicas={replicas}",
                ),
            ),
            tmp_path,
        )
        assert outcome.crash is None, outcome.crash
        assert outcome.code == 0
        assert time.process_time() - start < 2 * CASE_SECONDS
        counts.append(len(calls))
        calls.clear()
    assert counts[0] == counts[1] > 0


@pytest.mark.parametrize(
    "argv",
    [
        (
            "check",
            str(EXAMPLES / "gpt3-175b-selene.toml"),
            "--set",
            "num_layers=99999999999999999999",
        ),
        (
            "search",
            "--model",
            "gpt3-175b",
            "--gpus",
            "1024",
            "--global-batch",
            "1536",
            "--memory-headroom-gib",
            "nan",
        ),
    ],
)
def test_no_traceback_reaches_stderr_in_a_subprocess(argv: tuple[str, ...]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "blueprinting.cli.main", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith("invalid configuration")


def test_pipelines_beyond_the_stage_limits_are_refused_after_the_laws(tmp_path: Path) -> None:
    code, err = _answer(
        tmp_path,
        "plan",
        "--model",
        "gpt-1.7b",
        "--gpus",
        "1048576",
        "--set",
        "pipeline_model_parallel_size=1048576",
        "--set",
        "num_layers=1048576",
        "--set",
        "global_batch_size=1",
    )
    assert (code, err) == (
        2,
        "invalid configuration:\n  - pipeline_model_parallel_size = 1048576 exceeds the limit of "
        "1024 pipeline stages that are evaluated one by one (MAX_PIPELINE_STAGES)\n",
    )
    code, err = _answer(
        tmp_path,
        "simulate",
        "--model",
        "gpt-1.7b",
        "--gpus",
        "4",
        "--set",
        "pipeline_model_parallel_size=4",
        "--set",
        "num_layers=1048576",
        "--set",
        "num_virtual_stages_per_pipeline_rank=262144",
        "--set",
        "global_batch_size=4",
    )
    assert (code, err) == (
        2,
        "invalid configuration:\n  - p x v = 4 x 262144 = 1048576 model chunks exceed the limit "
        "of 8192 that are costed one by one (MAX_PIPELINE_CHUNKS)\n",
    )


def test_unwritable_output_paths_are_refused_before_any_work(tmp_path: Path) -> None:
    """plan used to print its whole report and then fail on --html; search --csv into a missing
    folder escaped as a traceback."""
    missing = tmp_path / "missing"
    outcome = run_case(
        Case(
            "direct",
            ("plan", str(EXAMPLES / "gpt3-175b-selene.toml"), "--html", f"{missing}/r.html"),
        ),
        tmp_path,
    )
    assert (outcome.code, outcome.out, outcome.crash) == (2, "", None)
    assert outcome.err == (
        "invalid configuration:\n"
        f"  - --html {missing}/r.html: cannot write the file: folder '{missing}' does not exist\n"
    )
    code, err = _answer(
        tmp_path,
        "search",
        "--model",
        "gpt-1.7b",
        "--gpus",
        "8",
        "--global-batch",
        "8",
        "--csv",
        f"{missing}/c.csv",
        "--html",
        str(tmp_path),
    )
    assert (code, err) == (
        2,
        "invalid configuration:\n"
        f"  - --html {tmp_path}: cannot write the file: it is a folder\n"
        f"  - --csv {missing}/c.csv: cannot write the file: folder '{missing}' does not exist\n",
    )
    code, err = _answer(
        tmp_path,
        "simulate",
        str(EXAMPLES / "gpt3-175b-selene.toml"),
        "--trace",
        f"{missing}/t.json",
    )
    assert (code, err) == (
        2,
        "invalid configuration:\n"
        f"  - --trace {missing}/t.json: cannot write the file: folder '{missing}' does not "
        "exist\n",
    )


def test_a_sweep_is_checked_whole_before_ray_starts(tmp_path: Path) -> None:
    """The fuzz harness stops a sweep at the door of Ray: one that passes every check exits 0
    there; a cell whose space is too large is refused first, naming the cell and the limit."""
    good = 'model = ["gpt-1.7b"]\nsystem = ["dgx-h100"]\ngpus = [8]\nglobal_batch = [16]\n'
    outcome = run_case(
        Case("sweep", ("sweep", "{dir}/s.toml", "--out", "{dir}/out"), (("s.toml", good),)),
        tmp_path,
    )
    assert (outcome.code, outcome.crash) == (0, None)
    assert outcome.err == "fuzz: the sweep passed its checks; Ray not started\n"
    huge = good.replace("gpus = [8]", "gpus = [9316358251200]")
    code, err = _answer(
        tmp_path, "sweep", "{dir}/h.toml", "--out", "{dir}/out2", files=(("h.toml", huge),)
    )
    assert code == 2
    assert err.startswith(
        f"invalid configuration in {tmp_path}/h.toml:\n"
        "  - cell gpt-1.7b dgx-h100 N=9316358251200 B=16: the search space has "
    )
    assert f"over the limit of {MAX_SEARCH_ROWS:,} (MAX_SEARCH_ROWS)" in err


@pytest.mark.parametrize(
    ("seed", "index"),
    [
        # stop 26's 10^5-case run: a published-runs fixture whose params_b overflowed or whose
        # head count was 0 before the model refused it, and plan summing 2**32 layers one by one
        (1203, 50469),
        (1203, 62073),
        (1203, 74371),
        (1203, 75484),
        # stop 27's: an infinite HBM capacity, an infinite moe_load_imbalance (twice) and a
        # published run of 0 GPUs (calibrate's TFLOP/s per GPU)
        (1272, 7138),
        (1272, 18358),
        (1272, 41418),
        (1272, 96280),
        # this stop's: a MoE validation fixture whose system is the empty string, and a plan on
        # a 2**31 - 1 GPU node (the placement ran out of memory)
        (1302, 35387),
        (1302, 59509),
        # an inconsistent_layout row whose d came to 0 (a modulo by zero in its check)
        (1303, 17345),
        # and a 5,000-digit hierarchical_context_parallel_sizes item (int() refuses it)
        (1303, 40828),
    ],
)
def test_the_long_runs_failures_answer_now(seed: int, index: int, tmp_path: Path) -> None:
    """The cases of ``benchmarks/fuzz_cli.py --cases 100000 --seed SEED`` that escaped with a
    traceback or ran past the 300 s abort: each answers with a message now."""
    import random

    rng = random.Random(f"{seed}:{index}")
    case = draw_case(rng, rng.choice(FORMS))
    outcome = run_case(case, tmp_path)
    assert problems_of(case, outcome, max_seconds=WALL_SECONDS, max_cpu_seconds=CASE_SECONDS) == []


def test_a_decimal_of_any_length_is_read_without_converting_it() -> None:
    """Fuzz seed 1303 case 40828: a 5,000-digit ``hierarchical_context_parallel_sizes`` item
    reached ``int()``, which refuses strings of over 4,300 digits; "²" passes ``isdigit``."""
    from blueprinting.limits import decimal_value

    assert decimal_value("0042") == 42
    assert decimal_value(str(MAX_INT)) == MAX_INT
    assert decimal_value("9" * 5000) == MAX_INT + 1
    assert decimal_value("0" * 5000 + "7") == 7
    assert decimal_value("²") is None
    assert decimal_value("") is None
    assert decimal_value("-3") is None
