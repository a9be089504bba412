"""Command-line flags declared on the fields of a settings dataclass, and the parser built from them.

A field of a tool's settings (TrainConfig of mgg.train, mgg.apps.config; the settings of
mgg.prepare, mgg.serve, mgg.predict, ...) is declared with `setting(default, Flag(...), ...)`: its
default (`REQUIRED`: none, the flag must be given), the flag(s) that set it (names -- one name
without dashes is a positional argument --, help, type, choices, argparse action), the help group
it is listed under, and what the other parts of the command line need to know about it
(`sampled_only`: only --mode sampled reads it; `per_run`: a --config file does not carry it over;
`internal`: no flag sets it). `add_flags` turns the fields into argparse arguments, so adding a flag
is one field plus the code that reads it. Help texts may name `{default}`, `{lo}` and `{hi}` (a
range type's bounds; a literal brace is doubled); a help that is a function is called when the
parser is built. Settings several tools share are declared once in mgg.apps.common_settings.

Argument types: `IntRange`, `FloatRange` (one-line errors naming the range), `fanout_list`, `size`.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
from typing import Any, Callable

__all__ = ["Flag", "OneOf", "setting", "REQUIRED", "parse_settings",
           "flags_of", "add_flags", "IntRange", "FloatRange", "fanout_list", "size",
           "SAME", "sampled_only_flags", "per_run_fields", "internal_fields", "flag_display"]

#: Flag.default when the parser's default is the field's
SAME = object()
#: setting()'s default of a field the command line must give (a positional argument, or required=True)
REQUIRED = dataclasses.MISSING


class OneOf:
    """A mutually exclusive group that flags of several fields share (`Flag(exclusive=OneOf(...))`,
    the same object on each); `required`: one of them must be given."""

    def __init__(self, required: bool = False):
        self.required = required


class Flag:
    """One command-line flag of a field: `names` (option strings), `help` (str, or a function
    returning it), and argparse's `type`, `choices` (a tuple, or a function returning one),
    `action` ("store_true", "store_false", "count", "store_const", or "bool": --x / --no-x),
    `const`, `nargs`, `metavar`; `default`: the parser's default where it is not the field's (a
    value parse_args resolves, such as None for "not given"); `group`: the --help section
    (None: the top); `exclusive`: True: flags of one field sharing it are mutually exclusive; a
    OneOf: the flags (of any fields) given that OneOf are. One name without a leading '-' is a
    positional argument named as the field."""

    def __init__(self, *names: str, help: str | Callable[[], str], type: Callable | None = None,  # noqa: A002
                 choices: tuple | Callable[[], tuple] | None = None, action: str | None = None, const: Any = None,
                 nargs: str | None = None, metavar: str | None = None, default: Any = SAME,
                 group: str | None = None, exclusive: bool | OneOf = False):
        positional = len(names) == 1 and names[0].isidentifier()
        if not names or not (positional or all(n.startswith("-") for n in names)):
            raise ValueError(f"flag names must start with '-' (or be one positional name), got {names!r}")
        self.positional = positional
        self.names, self.help, self.type, self.choices = names, help, type, choices
        self.action, self.const, self.nargs, self.metavar = action, const, nargs, metavar
        self.default, self.group, self.exclusive = default, group, exclusive

    def parser_default(self, field_default: Any) -> Any:
        return field_default if self.default is SAME else self.default

    def help_text(self, field_default: Any) -> str:
        text = self.help() if callable(self.help) else self.help
        values = {"default": field_default}
        if isinstance(self.type, (IntRange, FloatRange)):
            values.update(lo=self.type.lo, hi=self.type.hi)
        return text.format(**values)

    def kwargs(self, dest: str, field_default: Any) -> dict:
        """The keyword arguments of argparse's add_argument for this flag."""
        kw: dict[str, Any] = {"help": self.help_text(field_default)}
        if self.positional:
            if self.names[0] != dest:
                raise ValueError(f"positional argument {self.names[0]!r} must be named as its field {dest!r}")
        else:
            kw["dest"] = dest
        action = self.action
        if action == "bool":
            kw["action"] = argparse.BooleanOptionalAction
        elif action is not None:
            kw["action"] = action
        if field_default is REQUIRED:
            if not self.positional:
                kw["required"] = True
        else:
            kw["default"] = self.parser_default(field_default)
        if self.type is not None:
            kw["type"] = self.type
        if self.choices is not None:
            kw["choices"] = self.choices() if callable(self.choices) else self.choices
        for key in ("const", "nargs", "metavar"):
            if getattr(self, key) is not None:
                kw[key] = getattr(self, key)
        return kw


def setting(default: Any, *flags: Flag, sampled_only: bool = False, per_run: bool = False,
            internal: bool = False) -> Any:
    """A dataclass field with its default (REQUIRED: none) and the flags that set it (none:
    `internal` must say so). A class with REQUIRED fields after defaulted ones is declared
    `@dataclass(kw_only=True)`."""
    if not flags and not internal:
        raise ValueError("a setting without a flag must be declared internal=True")
    meta = {"flags": tuple(flags), "sampled_only": sampled_only, "per_run": per_run, "internal": internal}
    return dataclasses.field(default=default, metadata=meta)


def parse_settings(parser: argparse.ArgumentParser, cls, argv) -> Any:
    """`cls` from the command line `argv` (None: sys.argv[1:]) parsed by `parser` (built with
    add_flags(parser, cls)); argparse exits with status 2 on a bad value."""
    return cls(**vars(parser.parse_args(argv)))


def flags_of(cls) -> list[tuple[dataclasses.Field, tuple[Flag, ...]]]:
    """(field, its flags) of every field of the dataclass `cls` with flags, in declaration order."""
    return [(f, f.metadata["flags"]) for f in dataclasses.fields(cls) if f.metadata.get("flags")]


def flag_display(cls, name: str) -> str:
    """How messages name the flag of field `name`: its long name, "--x/--no-x" for a boolean pair."""
    flag = dict((f.name, fl) for f, fl in flags_of(cls))[name][0]
    long = max(flag.names, key=len)
    return f"{long}/--no-{long[2:]}" if flag.action == "bool" else long


def sampled_only_flags(cls) -> dict[str, str]:
    """Field -> flag of the fields only --mode sampled reads."""
    return {f.name: flag_display(cls, f.name) for f in dataclasses.fields(cls) if f.metadata.get("sampled_only")}


def per_run_fields(cls) -> frozenset[str]:
    """The fields a --config file does not carry over (each run's own files and presentation)."""
    return frozenset(f.name for f in dataclasses.fields(cls) if f.metadata.get("per_run"))


def internal_fields(cls) -> frozenset[str]:
    """The fields no flag sets."""
    return frozenset(f.name for f in dataclasses.fields(cls) if f.metadata.get("internal"))


def add_flags(parser: argparse.ArgumentParser, cls) -> None:
    """Add the flags of every field of `cls` to `parser`, each under its group (groups in the order
    they first appear)."""
    groups: dict[str, Any] = {}
    shared: dict[int, Any] = {}  # id(OneOf) -> its argparse group
    for field, flags in flags_of(cls):
        exclusive = None
        for flag in flags:
            target: Any = parser
            if flag.group is not None:
                if flag.group not in groups:
                    groups[flag.group] = parser.add_argument_group(flag.group)
                target = groups[flag.group]
            if isinstance(flag.exclusive, OneOf):
                one_of = flag.exclusive
                if id(one_of) not in shared:
                    shared[id(one_of)] = target.add_mutually_exclusive_group(required=one_of.required)
                target = shared[id(one_of)]
            elif flag.exclusive:
                exclusive = exclusive or target.add_mutually_exclusive_group()
                target = exclusive
            target.add_argument(*flag.names, **flag.kwargs(field.name, field.default))


# -- argument types -----------------------------------------------------------------------------
class IntRange:
    """argparse type: an integer in [lo, hi] (hi None: unbounded)."""

    def __init__(self, lo: int, hi: int | None = None):
        self.lo, self.hi = lo, hi

    def __call__(self, s: str) -> int:
        try:
            v = int(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {s!r}") from None
        if v < self.lo or (self.hi is not None and v > self.hi):
            rng = f"in [{self.lo}, {self.hi}]" if self.hi is not None else f">= {self.lo}"
            raise argparse.ArgumentTypeError(f"must be an integer {rng}, got {v}")
        return v

    def __repr__(self) -> str:  # argparse names the type in some messages
        return "int"


class FloatRange:
    """argparse type: a finite number between lo and hi, each bound open or closed; `what` words
    the range in the error ("in (0, 1]")."""

    def __init__(self, lo: float, hi: float, lo_open: bool, hi_open: bool, what: str):
        self.lo, self.hi, self.lo_open, self.hi_open, self.what = lo, hi, lo_open, hi_open, what

    def __call__(self, s: str) -> float:
        try:
            v = float(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {s!r}") from None
        ok = (math.isfinite(v) and (v > self.lo if self.lo_open else v >= self.lo)
              and (v < self.hi if self.hi_open else v <= self.hi))
        if not ok:
            raise argparse.ArgumentTypeError(f"must be {self.what}, got {s}")
        return v

    def __repr__(self) -> str:
        return "float"


def fanout_list(s: str) -> tuple[int, ...]:
    """argparse type: "25,10" -> (25, 10); every value a positive integer or -1 (all neighbors)."""
    parts = [p.strip() for p in s.split(",")]
    if not s.strip() or any(p == "" for p in parts):
        raise argparse.ArgumentTypeError(f"expected comma-separated fanouts such as 25,10, got {s!r}")
    out = []
    for i, p in enumerate(parts):
        try:
            v = int(p)
        except ValueError:
            raise argparse.ArgumentTypeError(f"fanout {p!r} (position {i + 1}) is not an integer; expected "
                                             f"comma-separated fanouts such as 25,10") from None
        if v < 1 and v != -1:
            raise argparse.ArgumentTypeError(f"fanout {v} (position {i + 1}) must be a positive integer or -1 "
                                             f"(all neighbors)")
        out.append(v)
    return tuple(out)


def size(s: str) -> int:
    """argparse type: bytes with an optional K/M/G/T suffix (powers of 1024); 0 = unlimited."""
    from ..sample.features import parse_size

    try:
        return parse_size(s)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
