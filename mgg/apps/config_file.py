"""`mgg.train --config FILE`: the settings of an earlier run, read back as flags.

FILE is one of: the metrics JSON of a run (`--metrics-json`; its ``config`` block), the JSON-lines
log of a run (`--log-jsonl`; the ``config`` of its start line), or a JSON object of TrainConfig
fields (``{"model": "gin", "epochs": 60}``). Every setting becomes the flag that sets it, placed
before the command line's own flags, so a flag given on the command line wins, and a bad value
gets the flag's own error (prefixed with the file). Left out: settings equal to the flag's
default, and where a run writes or reads its files (metrics, logs, weights, checkpoints, tuning
log), which belong to each run.
"""
from __future__ import annotations

import argparse
import json
from typing import Callable, Sequence

from .config import PER_RUN_KEYS

__all__ = ["config_tokens", "with_config_file", "PER_RUN_KEYS"]



class _Refused(Exception):
    pass


def _read_settings(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ValueError(f"--config {path}: cannot read: {e.strerror or e}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        first = text.lstrip().split("\n", 1)[0]
        try:
            doc = json.loads(first)  # a JSON-lines run log: its start line
        except json.JSONDecodeError as e:
            raise ValueError(f"--config {path}: not JSON, nor JSON lines ({e.msg} at line {e.lineno})") from None
    if not isinstance(doc, dict):
        raise ValueError(f"--config {path}: expected a JSON object, got {type(doc).__name__}")
    if isinstance(doc.get("config"), dict):
        doc = doc["config"]
    return doc


def config_tokens(parser: argparse.ArgumentParser, settings: dict, source: str) -> list[str]:
    """The command-line tokens that set `settings` (TrainConfig field -> value) on `parser`."""
    from dataclasses import MISSING, fields

    from .config import TrainConfig

    actions = {a.dest: a for a in parser._actions if a.option_strings}
    defaults = {f.name: f.default for f in fields(TrainConfig) if f.default is not MISSING}
    tokens: list[str] = []
    for key, value in settings.items():
        if key in PER_RUN_KEYS:
            continue
        action = actions.get(key)
        if action is None:
            raise ValueError(f"--config {source}: unknown setting {key!r}")
        if value is None or value == action.default or (key in defaults and value == defaults[key]):
            continue
        long = max(action.option_strings, key=len)
        if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
            if bool(value) != bool(action.default):
                tokens.append(long)
        elif isinstance(action, argparse.BooleanOptionalAction):  # option_strings: --x, --no-x
            tokens.append(action.option_strings[0] if value else action.option_strings[1])
        elif isinstance(value, (list, tuple)):
            tokens += [long, ",".join(str(v) for v in value)]
        elif isinstance(value, (dict, bool)):
            raise ValueError(f"--config {source}: setting {key!r} has the value {value!r}, which {long} does not take")
        else:
            tokens += [long, str(value)]
    return tokens


def with_config_file(build_parser: Callable[[], argparse.ArgumentParser], argv: Sequence[str]) -> list[str]:
    """`argv` with the settings of its ``--config FILE`` (if any) put before it as flags. A bad
    file or value: the parser's error (exit 2) naming the file."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config", dest="config_file", default=None)
    known, _ = pre.parse_known_args(argv)
    if not known.config_file:
        return list(argv)
    parser = build_parser()
    try:
        tokens = config_tokens(parser, _read_settings(known.config_file), known.config_file)
    except ValueError as e:
        parser.error(str(e))

    def refuse(message: str):
        raise _Refused(message)

    check = build_parser()
    check.error = refuse  # type: ignore[method-assign]
    try:
        check.parse_args(tokens)
    except _Refused as e:
        parser.error(f"--config {known.config_file}: {e}")
    return tokens + list(argv)
