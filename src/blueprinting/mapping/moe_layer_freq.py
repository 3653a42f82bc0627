"""Megatron-LM's ``--moe-layer-freq`` value <-> :data:`~blueprinting.mapping.model.MoeLayerPattern`.

Megatron-LM (``megatron/training/arguments.py`` ``moe_freq_type`` @d98e8a64) takes an integer N
(layer i is MoE iff ``i % N == 0``) or a Python list expression that it ``eval``-s, such as
``([0]*3+[1]*58)`` (DeepSeek-V3's three dense layers) or ``[0,1,1]``. This module reads the
integer and list-expression forms without ``eval``: a sum of list literals of 0/1, each
optionally repeated by ``* count``, in optional parentheses. A parse error names its position.
"""

from __future__ import annotations

from typing import assert_never

from blueprinting.errors import ConfigError
from blueprinting.limits import decimal_value
from blueprinting.mapping.model import MoeLayerFrequency, MoeLayerList, MoeLayerPattern

_DIGITS = frozenset("0123456789")

_MAX_LAYERS = 1_000_000


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.at = 0

    def fail(self, what: str) -> ConfigError:
        return ConfigError(
            [f"moe_layer_freq {self.text!r}: {what} at position {self.at}"],
        )

    def skip(self) -> None:
        while self.at < len(self.text) and self.text[self.at].isspace():
            self.at += 1

    def peek(self) -> str:
        self.skip()
        return self.text[self.at] if self.at < len(self.text) else ""

    def expect(self, char: str) -> None:
        if self.peek() != char:
            found = repr(self.peek()) if self.peek() else "the end"
            raise self.fail(f"expected {char!r}, found {found}")
        self.at += 1

    def integer(self) -> int:
        self.skip()
        start = self.at
        while self.at < len(self.text) and self.text[self.at] in _DIGITS:
            self.at += 1
        if start == self.at:
            found = repr(self.peek()) if self.peek() else "the end"
            raise self.fail(f"expected an integer, found {found}")
        value = decimal_value(self.text[start : self.at])
        assert value is not None  # ASCII digits by the loop above
        if value > _MAX_LAYERS:
            self.at = start
            raise self.fail(f"{value} is more than {_MAX_LAYERS:,} layers")
        return value

    def flags(self) -> list[bool]:
        self.expect("[")
        out: list[bool] = []
        if self.peek() == "]":
            self.at += 1
            return out
        while True:
            start = self.at
            value = self.integer()
            if value not in (0, 1):
                self.at = start
                self.skip()
                raise self.fail(f"layer flag {value} is not 0 or 1")
            out.append(value == 1)
            if self.peek() == ",":
                self.at += 1
                continue
            self.expect("]")
            return out

    def term(self) -> list[bool]:
        if self.peek() == "(":
            self.at += 1
            inner = self.sum()
            self.expect(")")
            items = inner
        else:
            items = self.flags()
        if self.peek() == "*":
            self.at += 1
            count = self.integer()
            if len(items) * count > _MAX_LAYERS:
                raise self.fail(f"the list repeats to more than {_MAX_LAYERS:,} layers")
            items = items * count
        return items

    def sum(self) -> list[bool]:
        out = self.term()
        while self.peek() == "+":
            self.at += 1
            out = out + self.term()
            if len(out) > _MAX_LAYERS:
                raise self.fail(f"the list has more than {_MAX_LAYERS:,} layers")
        return out


def parse_moe_layer_freq(value: int | str) -> MoeLayerPattern:
    """An integer or Megatron's list expression as a layer pattern; :class:`ConfigError` naming
    the position of the first thing that is not one."""
    if isinstance(value, int):
        return MoeLayerFrequency(every=value)
    text = value.strip()
    if (every := decimal_value(text)) is not None:
        return MoeLayerFrequency(every=every)
    parser = _Parser(value)
    layers = parser.sum()
    if parser.peek():
        raise parser.fail(f"unexpected {parser.peek()!r}")
    return MoeLayerList(layers=tuple(layers))


def format_moe_layer_freq(pattern: MoeLayerPattern) -> int | str:
    """The inverse: N for a frequency, else the run-length list expression Megatron-LM takes,
    e.g. ``([0]*3+[1]*58)``."""
    match pattern:
        case MoeLayerFrequency(every=every):
            return every
        case MoeLayerList(layers=layers):
            runs: list[tuple[bool, int]] = []
            for flag in layers:
                if runs and runs[-1][0] == flag:
                    runs[-1] = (flag, runs[-1][1] + 1)
                else:
                    runs.append((flag, 1))
            return "(" + "+".join(f"[{int(flag)}]*{count}" for flag, count in runs) + ")"
        case _ as unreachable:
            assert_never(unreachable)
