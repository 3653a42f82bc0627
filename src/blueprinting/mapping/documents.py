"""Reading TOML, JSON and YAML documents from user files, every failure a ``ConfigError``.

The parsers are the standard ones (``tomllib``, ``json``, PyYAML's safe loader: no Python
objects, only plain data); around them the limits of :mod:`blueprinting.limits` keep a small
hostile file from taking minutes or gigabytes:

- at most ``MAX_FILE_BYTES`` are read;
- nesting deeper than ``MAX_DOCUMENT_DEPTH`` is refused (the parsers themselves recurse and
  would raise ``RecursionError`` on a few thousand brackets);
- YAML aliases are counted at every use: a document whose node graph expands to more than
  ``MAX_YAML_NODES`` nodes (a "billion laughs" alias bomb, kilobytes that expand to gigabytes) or
  that refers to itself is refused before any Python value is built;
- integers longer than Python's 4,300-digit conversion limit, undecodable bytes and parser
  errors are reported as malformed input.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

from blueprinting.errors import ConfigError
from blueprinting.limits import MAX_DOCUMENT_DEPTH, MAX_FILE_BYTES, MAX_YAML_NODES


def read_text(path: Path, *, what: str = "file") -> str:
    """The file's text (UTF-8), refused beyond ``MAX_FILE_BYTES``."""
    source = str(path)
    try:
        with path.open("rb") as stream:
            raw = stream.read(MAX_FILE_BYTES + 1)
    except OSError as error:
        raise ConfigError(
            [f"cannot read {what}: {error.strerror or error}"], source=source
        ) from None
    if len(raw) > MAX_FILE_BYTES:
        raise ConfigError(
            [f"{what} is larger than the limit of {MAX_FILE_BYTES:,} bytes (MAX_FILE_BYTES)"],
            source=source,
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError([f"{what} is not UTF-8 text: {error}"], source=source) from None


def parse_toml(text: str, source: str) -> object:
    try:
        data: object = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError([f"malformed toml: {error}"], source=source) from None
    except (ValueError, RecursionError) as error:
        raise ConfigError([f"malformed toml: {_short(error)}"], source=source) from None
    return _check_depth(data, source)


def parse_json(text: str, source: str) -> object:
    try:
        data: object = json.loads(text)
    except json.JSONDecodeError as error:
        raise ConfigError([f"malformed json: {error}"], source=source) from None
    except (ValueError, RecursionError) as error:
        raise ConfigError([f"malformed json: {_short(error)}"], source=source) from None
    return _check_depth(data, source)


def parse_yaml(text: str, source: str) -> object:
    import yaml

    try:
        loader = yaml.SafeLoader(text)
    except yaml.YAMLError as error:  # the reader refuses control characters up front
        raise ConfigError([f"malformed yaml: {error}"], source=source) from None
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_yaml_graph(node, source)
        data: object = loader.construct_document(node)
    except yaml.YAMLError as error:
        raise ConfigError([f"malformed yaml: {error}"], source=source) from None
    except (ValueError, TypeError, RecursionError) as error:
        raise ConfigError([f"malformed yaml: {_short(error)}"], source=source) from None
    finally:
        loader.dispose()
    return _check_depth(data, source)


def _short(error: BaseException) -> str:
    if isinstance(error, RecursionError):
        return f"nested too deeply (more than {MAX_DOCUMENT_DEPTH} levels are refused)"
    return str(error)


def _check_yaml_graph(root: object, source: str) -> None:
    """Refuse a YAML node graph that expands (aliases counted at every use) to more than
    ``MAX_YAML_NODES`` nodes, is deeper than ``MAX_DOCUMENT_DEPTH`` or contains a cycle."""
    import yaml

    def children(node: object) -> list[object]:
        if isinstance(node, yaml.SequenceNode):
            return list(node.value)
        if isinstance(node, yaml.MappingNode):
            return [part for pair in node.value for part in pair]
        return []

    # Expanded size of each node, computed bottom-up without recursion; shared nodes are
    # visited once, so the check costs the graph's size, not its expansion.
    size: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[object, int, bool]] = [(root, 1, False)]
    while stack:
        node, depth, done = stack.pop()
        key = id(node)
        if done:
            on_path.discard(key)
            total = 1 + sum(size[id(child)] for child in children(node))
            if total > MAX_YAML_NODES:
                raise ConfigError(
                    [
                        f"yaml document expands to more than {MAX_YAML_NODES:,} nodes "
                        "(MAX_YAML_NODES; aliases counted at every use)"
                    ],
                    source=source,
                )
            size[key] = total
            continue
        if key in size:
            continue
        if key in on_path:
            raise ConfigError(["yaml document refers to itself through an alias"], source=source)
        if depth > MAX_DOCUMENT_DEPTH:
            raise ConfigError(
                [f"yaml document is nested deeper than {MAX_DOCUMENT_DEPTH} levels"], source=source
            )
        on_path.add(key)
        stack.append((node, depth, True))
        stack.extend((child, depth + 1, False) for child in children(node) if id(child) not in size)


def _check_depth(data: object, source: str) -> object:
    """``data`` itself, refused when nested deeper than ``MAX_DOCUMENT_DEPTH``."""
    stack: list[tuple[object, int]] = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DOCUMENT_DEPTH:
            raise ConfigError(
                [f"document is nested deeper than {MAX_DOCUMENT_DEPTH} levels"], source=source
            )
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value)
    return data
