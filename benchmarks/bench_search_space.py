"""Time the strategy-space enumeration and law filter for GPT-3 175B on 1024 A100s, B = 1536.

Run: ``.venv/bin/python benchmarks/bench_search_space.py [repeats]``. Prints candidates enumerated,
valid, per-law rejections and the best wall time of ``repeats`` runs (one core, numpy only).
"""

from __future__ import annotations

import sys
import time

from blueprinting.mapping.model import TransformerModelSpec
from blueprinting.search.space import SearchSpace, enumerate_strategies

# Narayanan et al. 2021, Table 1 (175B row); vocabulary 51200 as Megatron pads GPT-2's 50257.
GPT3_175B = TransformerModelSpec(
    name="gpt3-175b",
    num_layers=96,
    hidden_size=12288,
    num_attention_heads=96,
    num_query_groups=96,
    kv_channels=128,
    ffn_hidden_size=49152,
    seq_length=2048,
    vocab_size=51200,
    padded_vocab_size=51200,
)


def main(repeats: int) -> None:
    for label, space in (
        ("default space", SearchSpace(gpu_counts=(1024,), global_batch_size=1536)),
        (
            "cross-node TP, no Megatron rules",
            SearchSpace(
                gpu_counts=(1024,),
                global_batch_size=1536,
                allow_cross_node_tp=True,
                megatron_rules=False,
            ),
        ),
    ):
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            result = enumerate_strategies(GPT3_175B, space)
            best = min(best, time.perf_counter() - start)
        report = result.report
        print(f"GPT-3 175B, 1024 GPUs, B=1536, {label}")
        print(f"  candidates enumerated {report.candidates_enumerated:>12,}")
        print(f"  candidates valid      {report.candidates_valid:>12,}")
        for law, count in report.rejections:
            print(f"  rejected {law:<38} {count:>12,}")
        print(f"  wall time (best of {repeats}) {best * 1e3:8.1f} ms")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
