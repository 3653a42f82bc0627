"""Output files named on the command line, checked before any work is done (issue #18: a
command refuses up front rather than after minutes of planning or searching)."""

from __future__ import annotations

from pathlib import Path

from blueprinting.errors import ConfigError


def output_path_problem(flag: str, path: str | Path | None) -> str | None:
    """Why ``path`` (given to ``flag``) cannot be written as a file, or None where it can be
    tried (``-`` is stdout; permissions are left to the write itself)."""
    if path is None or str(path) == "-":
        return None
    target = Path(path)
    if target.is_dir():
        return f"{flag} {path}: cannot write the file: it is a folder"
    folder = target.parent
    if not folder.is_dir():
        return f"{flag} {path}: cannot write the file: folder {str(folder)!r} does not exist"
    return None


def check_output_paths(*flags: tuple[str, str | Path | None]) -> None:
    """Raise one :class:`ConfigError` naming every output path of ``flags`` (pairs of the flag
    and its value) that cannot be written."""
    problems = [p for flag, path in flags if (p := output_path_problem(flag, path)) is not None]
    if problems:
        raise ConfigError(problems)
