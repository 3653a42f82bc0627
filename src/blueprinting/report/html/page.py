"""What every HTML report shares: the Jinja2 environment, the inlined Plotly bundle, figures,
readers of the JSON report and the number formats the page shows.

A page is rendered from the report's JSON object (the ``--json`` output of the same command),
which the page also carries verbatim in ``<script id="report-json">``: every figure and number on
it can be traced to a key of that object. Nothing is loaded at view time: the Plotly bundle,
the styles and the page's own script are inlined, and there is no timestamp, so the same report
gives the same bytes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, final

from blueprinting.analysis.report import JsonValue
from blueprinting.errors import ConfigError

if TYPE_CHECKING:
    import jinja2

JsonObject = dict[str, JsonValue]

GIB = 2**30


def field(document: JsonObject, key: str) -> JsonValue:
    if key not in document:
        raise KeyError(f"report JSON has no key {key!r}")
    return document[key]


def obj(document: JsonObject, key: str) -> JsonObject:
    value = field(document, key)
    if not isinstance(value, dict):
        raise TypeError(f"report JSON {key!r} is not an object: {value!r}")
    return value


def array(document: JsonObject, key: str) -> list[JsonValue]:
    value = field(document, key)
    if not isinstance(value, list):
        raise TypeError(f"report JSON {key!r} is not a list: {value!r}")
    return value


def objects(document: JsonObject, key: str) -> list[JsonObject]:
    out: list[JsonObject] = []
    for item in array(document, key):
        if not isinstance(item, dict):
            raise TypeError(f"report JSON {key!r} holds a non-object: {item!r}")
        out.append(item)
    return out


def number(document: JsonObject, key: str) -> float:
    value = field(document, key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"report JSON {key!r} is not a number: {value!r}")
    return float(value)


def integer(document: JsonObject, key: str) -> int:
    value = field(document, key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"report JSON {key!r} is not an integer: {value!r}")
    return value


def text(document: JsonObject, key: str) -> str:
    value = field(document, key)
    if not isinstance(value, str):
        raise TypeError(f"report JSON {key!r} is not a string: {value!r}")
    return value


def numbers(document: JsonObject, key: str) -> list[float]:
    out: list[float] = []
    for item in array(document, key):
        if isinstance(item, bool) or not isinstance(item, int | float):
            raise TypeError(f"report JSON {key!r} holds a non-number: {item!r}")
        out.append(float(item))
    return out


def strings(document: JsonObject, key: str) -> list[str]:
    return [str(item) for item in array(document, key)]


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Shown:
    """A figure as the page prints it: ``key`` is its JSON path (``memory_bytes.total``),
    ``value`` its exact JSON value (``repr``, in the element's ``data-value``), ``label`` the
    rounded text a person reads."""

    key: str
    value: str
    label: str


def seconds(key: str, value: float) -> Shown:
    return Shown(key=key, value=repr(value), label=seconds_label(value))


def seconds_label(value: float) -> str:
    return f"{value:.6g} s"


def gib(key: str, value: int) -> Shown:
    return Shown(key=key, value=str(value), label=gib_label(value))


def gib_label(value: int) -> str:
    return f"{value / GIB:.2f} GiB"


def fraction(key: str, value: float) -> Shown:
    return Shown(key=key, value=repr(value), label=f"{100 * value:.2f}%")


def plain(key: str, value: float | int, fmt: str) -> Shown:
    return Shown(key=key, value=repr(value), label=format(value, fmt))


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Figure:
    """A Plotly figure, serialized: ``spec`` is its JSON (``data``, ``layout``), safe to place
    inside a ``<script type="application/json">`` element."""

    id: str
    title: str
    caption: str
    spec: str


def figure(fig_id: str, title: str, caption: str, fig: Any) -> Figure:
    """Serialize a ``plotly.graph_objects.Figure`` (validated when it was built)."""
    import plotly.io as pio

    return Figure(id=fig_id, title=title, caption=caption, spec=_script_safe(pio.to_json(fig)))


def _script_safe(text: str) -> str:
    # As Jinja2's tojson: no "</script>" or HTML-significant character can end the element.
    return (
        text.replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("&", "\\u0026")
        .replace("'", "\\u0027")
    )


def report_json(document: JsonObject) -> str:
    return _script_safe(json.dumps(document, separators=(",", ":")))


@cache
def _environment() -> jinja2.Environment:
    import jinja2
    import plotly
    from plotly.offline import get_plotlyjs

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("blueprinting.report.html", "templates"),
        autoescape=jinja2.select_autoescape(default=True, default_for_string=True),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.globals["plotly_js"] = get_plotlyjs()
    env.globals["plotly_version"] = str(plotly.__version__)
    return env


def render(template: str, **context: object) -> str:
    """Render ``template`` (a file of ``templates/``) with ``context``."""
    from importlib.metadata import version

    from markupsafe import Markup

    env = _environment()
    values = dict(context)
    values["blueprinting_version"] = version("blueprinting")
    values["plotly_js_inline"] = Markup(str(env.globals["plotly_js"]))
    return env.get_template(template).render(values)


def write_html(text: str, path: str | Path) -> Path:
    """Write the page; a path that cannot be written is a ConfigError naming it."""
    out = Path(path)
    try:
        out.write_text(text, encoding="utf-8")
    except OSError as error:
        raise ConfigError([f"--html {path}: cannot write the file: {error.strerror}"]) from None
    return out
