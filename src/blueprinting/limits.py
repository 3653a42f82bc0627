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
MAX_SEARCH_CANDIDATES = 250_000

#: ``blueprinting infer``: decode steps costed one by one; beyond this many the decode rounds are
#: costed at this many evenly spaced contexts (first and last included) and averaged.
MAX_EXACT_DECODE_STEPS = 4096

#: YAML strategy files: nodes the loader may build (aliases counted at every use), so that a small
#: file whose aliases expand to gigabytes (a "billion laughs") is refused at once.
MAX_YAML_NODES = 100_000

#: Strategy files: bytes read.
MAX_FILE_BYTES = 16 * 1024 * 1024


def int_limit_text() -> str:
    """How messages name :data:`MAX_INT`."""
    return f"2**63 - 1 = {MAX_INT}"


#: Strategy, system and config.json documents: nesting depth (tables and arrays within each other).
MAX_DOCUMENT_DEPTH = 64
