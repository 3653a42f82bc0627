"""The stated limits on user input: every command answers within seconds or refuses up front.

Each limit is named in the message that refuses a value beyond it (the limit and the value).
"""

from __future__ import annotations

#: Every integer a user gives (GPU counts, degrees, batch sizes, layer counts, lengths) is at most
#: this: a signed 64-bit integer, what Megatron-LM's own arguments and numpy's int64 hold.
MAX_INT = 2**63 - 1

#: ``blueprinting search``: upper bound on the law-relevant rows of a space (GPU counts x t x p x
#: v x micro-batch x sp x recompute, interleaved rows counted with their P2P and group options),
#: computed from divisor counts before anything is enumerated. GPT-3 175B on 1024 GPUs, B = 1536
#: has 205,200; the limit keeps enumeration under about a second and a gigabyte.
MAX_SEARCH_ROWS = 4_000_000

#: ``blueprinting search``: lawful candidates evaluated (after the law filter, before the free
#: optimizer options multiply them); GPT-3 175B on 1024 GPUs has 53,625, evaluated at about
#: 40,000 a second on one slow core.
MAX_SEARCH_CANDIDATES = 120_000

#: ``blueprinting infer``: decode steps costed one by one; beyond this many the decode rounds are
#: costed at this many evenly spaced contexts (first and last included) and averaged.
MAX_EXACT_DECODE_STEPS = 4096

#: YAML strategy files: nodes the loader may build (aliases counted at every use), so that a small
#: file whose aliases expand to gigabytes (a "billion laughs") is refused at once.
MAX_YAML_NODES = 100_000

#: Strategy files: bytes read.
MAX_FILE_BYTES = 16 * 1024 * 1024


def decimal_value(text: str) -> int | None:
    """``text`` as a non-negative integer when it is ASCII digits only, else None (``str.isdigit``
    also admits digits ``int`` refuses, such as "²"). More digits than :data:`MAX_INT` has are
    read as ``MAX_INT + 1`` without converting them (Python refuses strings of over 4,300
    digits), so that a caller's range check names the limit."""
    if not text or not (text.isascii() and text.isdigit()):
        return None
    significant = text.lstrip("0") or "0"
    if len(significant) > len(str(MAX_INT)):
        return MAX_INT + 1
    return int(significant)


def int_limit_text() -> str:
    """How messages name :data:`MAX_INT`."""
    return f"2**63 - 1 = {MAX_INT}"


#: Strategy, system and config.json documents: nesting depth (tables and arrays within each other).
MAX_DOCUMENT_DEPTH = 64

#: ``plan``, ``simulate`` and ``infer`` evaluate every pipeline stage (memory per stage, stage
#: costs): at most this many stages (about a second at 1,024). Megatron-LM runs use tens.
MAX_PIPELINE_STAGES = 1024

#: ``plan`` and ``simulate`` cost every model chunk (p x v virtual stages) one by one.
MAX_PIPELINE_CHUNKS = 8192


def stage_limit_problem(stages: int, virtual_stages: int = 1) -> str | None:
    """The message refusing more than :data:`MAX_PIPELINE_STAGES` stages or
    :data:`MAX_PIPELINE_CHUNKS` model chunks; None within both."""
    if stages > MAX_PIPELINE_STAGES:
        return (
            f"pipeline_model_parallel_size = {stages} exceeds the limit of {MAX_PIPELINE_STAGES} "
            "pipeline stages that are evaluated one by one (MAX_PIPELINE_STAGES)"
        )
    if stages * virtual_stages > MAX_PIPELINE_CHUNKS:
        return (
            f"p x v = {stages} x {virtual_stages} = {stages * virtual_stages} model chunks exceed "
            f"the limit of {MAX_PIPELINE_CHUNKS} that are costed one by one (MAX_PIPELINE_CHUNKS)"
        )
    return None


#: ``blueprinting search``: distinct block configurations (t, sp, cp and its comm type, ep, etp,
#: dispatcher, micro-batch, recompute scope, precision ...) the scalar planner derives and costs
#: one by one, the longest step of a search. Up to this many a search answers within the
#: README's time bound (5 s of CPU); beyond it the space is not refused (each configuration is a
#: strategy a user may want ranked) but streamed: the search says up front, on stderr, how many it
#: costs and how much longer that may take (:func:`search_blocks_notice`), with a progress bar on
#: a terminal; the bound grows by :data:`SEARCH_SECONDS_PER_BLOCK` a configuration beyond it.
#: 800, not the 1,000 it was: a plain MoE search of that size leaves no room for a loaded
#: machine (GPT-OSS 20B on 64 A100s: 1,008 configurations at 2.5 ms, 63,192 candidates and
#: 4.1 million enumerated rows, 4.4-4.8 s of CPU as a process on an idle two-core machine, 5.0 s
#: beside other work: fuzz seed 1307 case 33155).
SEARCH_BLOCKS_WITHIN_BOUND = 800

#: CPU seconds one block configuration may take beyond :data:`SEARCH_BLOCKS_WITHIN_BOUND` (the
#: time bound's allowance). Measured: 0.7-2.2 ms a MoE configuration in
#: ``benchmarks/bench_slow_commands.py`` under a load of about 1, and up to 2.7 ms with the
#: fixed part on two fuzz workers sharing two cores (Mixtral 8x7B, ``--context-parallel auto``,
#: 2,767 configurations in 10.6 s; fuzz seed 1304 case 17367, over a 3 ms allowance).
SEARCH_SECONDS_PER_BLOCK = 0.004

#: ``blueprinting search``: lawful candidates evaluated (each row of the vectorized tables, and
#: the distinct strategies their stage memory, NCCL buffers and gradient reductions read, which
#: grow with them) within the time bound beside :data:`SEARCH_BLOCKS_WITHIN_BOUND` block
#: configurations; beyond it the search says so before it evaluates
#: (:func:`search_candidates_notice`) and the bound grows by
#: :data:`SEARCH_SECONDS_PER_CANDIDATE` a candidate. Up to ``MAX_SEARCH_CANDIDATES`` (refused
#: beyond). The README's example searches stay within it (GPT-3 175B on 1,024 GPUs: 53,625 in about
#: 2.7 s; Llama 3 70B at s = 32,768 over cp and cp_comm_type: 88,116 in about 5 s).
SEARCH_CANDIDATES_WITHIN_BOUND = 90_000

#: CPU seconds one lawful candidate may take beyond :data:`SEARCH_CANDIDATES_WITHIN_BOUND`.
#: Measured (``benchmarks/bench_slow_commands.py``, idle two-core machine): 11 us a dense
#: candidate (GPT-3 175B, 53,625 -> 86,955 candidates over the same 282 block configurations:
#: +0.37 s), 19 us a MoE one (Qwen3-30B-A3B over 4 and 1,536 GPUs, 113,214 candidates and 1,287
#: block configurations, 6.2 s, fuzz seed 1304 case 78049); 25 us leaves room for two fuzz
#: workers sharing two cores, as the block allowance does.
SEARCH_SECONDS_PER_CANDIDATE = 2.5e-5

#: ``blueprinting search --csv``: rows written (every lawful candidate that fits, up to
#: ``MAX_SEARCH_CANDIDATES``) within the time bound; beyond it the search says so before it
#: writes (:func:`search_csv_notice`) and the bound grows by :data:`SEARCH_SECONDS_PER_CSV_ROW`.
SEARCH_CSV_ROWS_WITHIN_BOUND = 20_000

#: CPU seconds one CSV row may take beyond :data:`SEARCH_CSV_ROWS_WITHIN_BOUND`: its strategy
#: text and 15 figures (about 25 us measured on a loaded two-core machine).
SEARCH_SECONDS_PER_CSV_ROW = 4e-5

#: The README's time bound: CPU seconds of one command as a process on one core.
TIME_BOUND_CPU_SECONDS = 5.0


def _streamed(
    what: str, count: int, *, unit: str, within: int, limit_name: str, per_item: float
) -> str | None:
    if count <= within:
        return None
    return (
        f"search: {what} {count:,} {unit}, more than the {within:,} within the "
        f"{TIME_BOUND_CPU_SECONDS:g} s time bound ({limit_name}): allow "
        f"{per_item * (count - within):.1f} s more of CPU"
    )


def search_blocks_notice(count: int) -> str | None:
    """What a search costing ``count`` block configurations says before it starts: None within
    :data:`SEARCH_BLOCKS_WITHIN_BOUND`."""
    return _streamed(
        "costing",
        count,
        unit="block configurations",
        within=SEARCH_BLOCKS_WITHIN_BOUND,
        limit_name="SEARCH_BLOCKS_WITHIN_BOUND",
        per_item=SEARCH_SECONDS_PER_BLOCK,
    )


def search_candidates_notice(count: int) -> str | None:
    """What a search evaluating ``count`` lawful candidates says before it starts: None within
    :data:`SEARCH_CANDIDATES_WITHIN_BOUND`."""
    return _streamed(
        "evaluating",
        count,
        unit="candidates",
        within=SEARCH_CANDIDATES_WITHIN_BOUND,
        limit_name="SEARCH_CANDIDATES_WITHIN_BOUND",
        per_item=SEARCH_SECONDS_PER_CANDIDATE,
    )


def search_csv_notice(rows: int) -> str | None:
    """What ``search --csv`` says before it writes ``rows`` rows: None within
    :data:`SEARCH_CSV_ROWS_WITHIN_BOUND`."""
    return _streamed(
        "writing",
        rows,
        unit="CSV rows",
        within=SEARCH_CSV_ROWS_WITHIN_BOUND,
        limit_name="SEARCH_CSV_ROWS_WITHIN_BOUND",
        per_item=SEARCH_SECONDS_PER_CSV_ROW,
    )


#: GPUs in one node or one NVLink domain (``gpus_per_node``, ``nvlink_domain_size``): placing a
#: communicator examines up to this many block offsets of its ranks on the nodes
#: (``hardware.system._enumerate_groups``), a few milliseconds here; an NVL72 rack has 72.
MAX_GPUS_PER_DOMAIN = 2**20


def domain_limit_problem(name: str, value: int) -> str | None:
    """The message refusing a node or NVLink domain above :data:`MAX_GPUS_PER_DOMAIN`."""
    if value <= MAX_GPUS_PER_DOMAIN:
        return None
    return (
        f"{name} = {value} exceeds the limit of {MAX_GPUS_PER_DOMAIN:,} GPUs in one node or "
        "NVLink domain (MAX_GPUS_PER_DOMAIN)"
    )


#: ``blueprinting search``: strategies listed in text or JSON (``--top``, 0 for all), each
#: re-planned by the scalar planner; ``--csv`` writes every candidate without that limit.
MAX_SEARCH_LISTED = 50


#: ``blueprinting sweep``: cells in one grid (each one full search, about a second on one core:
#: 65,536 cells are about 18 core-hours). Sizing every cell's search space before Ray starts
#: takes about 64 us a cell, so this limit also keeps the refusal of a bad grid within seconds
#: (issue 18; 10^6 cells took about 64 s of checks).
MAX_SWEEP_CELLS = 65_536
