"""The other command-line tools declare their flags as mgg.train does: each has a frozen settings
dataclass whose fields declare their flags (mgg.apps.flag_spec), its parser is built from it, and
a setting two tools share (--seed, --scale, --backend, ...) is declared once
(mgg.apps.common_settings)."""
from __future__ import annotations

import argparse
import ast
import dataclasses

import pytest

from mgg import build, doctor, export, predict, serve, tune
from mgg.apps import prepare_cli
from mgg.apps.flag_spec import (REQUIRED, SAME, Flag, OneOf, add_flags, flags_of, internal_fields, parse_settings,
                                 setting)
from mgg.knobs import BACKENDS, SERVICE_DEFAULTS

from mgg.testing.paths import ROOT

#: (tool, its settings class, the least command line it accepts, the fields that command line sets)
TOOLS = [
    (prepare_cli, prepare_cli.PrepareSettings, ["g.npz"], {"dataset": "g.npz"}),
    (serve, serve.ServeSettings, ["--tables", "t.json"], {"tables": "t.json"}),
    (predict, predict.PredictSettings, ["--dataset", "d", "--weights", "w", "--out", "o.npz"],
     {"dataset": "d", "weights": "w", "out": "o.npz"}),
    (doctor, doctor.DoctorSettings, [], {}),
    (tune, tune.TuneSettings, ["--report", "log.json"], {"report": "log.json"}),
    (build, build.BuildSettings, [], {}),
    (export, export.ExportSettings, ["ckpt", "w.pt"], {"checkpoint": "ckpt", "out": "w.pt"}),
]
IDS = [t[0].__name__ for t in TOOLS]


def _actions(parser: argparse.ArgumentParser) -> dict[str, list[argparse.Action]]:
    out: dict[str, list[argparse.Action]] = {}
    for a in parser._actions:
        if a.dest != "help":
            out.setdefault(a.dest, []).append(a)
    return out


@pytest.mark.parametrize("tool, cls, argv, required", TOOLS, ids=IDS)
def test_every_field_has_a_flag_and_every_flag_a_field(tool, cls, argv, required):
    actions = _actions(tool.build_parser())
    internal = internal_fields(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for name in names:
        assert (name in actions) != (name in internal), f"{tool.__name__}: {name}: a flag, or internal=True"
    assert set(actions) <= names, f"{tool.__name__}: flags that set no field: {set(actions) - names}"
    assert cls.__dataclass_params__.frozen, f"{cls.__name__} is frozen"


@pytest.mark.parametrize("tool, cls, argv, required", TOOLS, ids=IDS)
def test_flag_defaults_are_the_field_defaults(tool, cls, argv, required):
    """The parser's default is the field's; the least command line gives the dataclass's defaults;
    a REQUIRED field is a required argument."""
    parser = tool.build_parser()
    actions = _actions(parser)
    for field, flags in flags_of(cls):
        for flag, action in zip(flags, actions[field.name]):
            if field.default is REQUIRED:
                assert action.required, f"{tool.__name__}: {field.name} is required"
            elif flag.default is SAME:
                assert action.default == field.default, f"{tool.__name__}: {field.name}: {action.default!r}"
    assert parse_settings(parser, cls, argv) == cls(**required)
    assert {f.name for f in dataclasses.fields(cls) if f.default is REQUIRED} <= set(required)


#: flags several tools declare; each must come from mgg.apps.common_settings (the same default)
SHARED = ("--seed", "--scale", "--undirected", "--reorder-nodes", "--backend", "--ranks-per-node", "--force")


def test_shared_flags_have_one_declaration():
    from mgg.apps.common_settings import DEFAULT_SCALE, DEFAULT_SEED, reorder_choices
    from mgg.apps.config import TrainConfig

    expected = {"--seed": DEFAULT_SEED, "--scale": DEFAULT_SCALE, "--undirected": False, "--reorder-nodes": "auto",
                "--ranks-per-node": None, "--force": False}
    seen: dict[str, int] = {}
    for cls in [TrainConfig] + [t[1] for t in TOOLS]:
        for field, flags in flags_of(cls):
            for flag in flags:
                for name in set(flag.names) & set(SHARED):
                    seen[name] = seen.get(name, 0) + 1
                    if name == "--backend":
                        choices = flag.choices
                        assert set(choices) <= set(BACKENDS) and field.default in choices, cls.__name__
                    else:
                        assert field.default == expected[name], f"{cls.__name__} {name}: {field.default!r}"
                    if name == "--reorder-nodes":
                        assert flag.choices is reorder_choices, cls.__name__
    assert all(seen.get(n, 0) >= 2 for n in SHARED), seen


def test_the_service_flags_default_to_the_service_defaults():
    from mgg.embedding.service import ServiceConfig

    settings, config = serve.ServeSettings(tables="t.json"), ServiceConfig()
    for name, value in SERVICE_DEFAULTS.items():
        assert getattr(settings, name) == getattr(config, name) == value, name
    assert set(serve.LIMIT_FIELDS) == set(SERVICE_DEFAULTS) - {"host", "port"}


def test_no_tool_adds_a_flag_by_hand():
    """Flags are declared on fields; argparse's add_argument is called by flag_spec (and by the
    --config pre-parser, which reads that one flag before the real parse)."""
    allowed = {"mgg/apps/flag_spec.py", "mgg/apps/config_file.py"}
    hand = []
    for path in sorted((ROOT / "mgg").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "add_argument" and rel not in allowed):
                hand.append(f"{rel}:{node.lineno}")
    assert not hand, f"add_argument outside mgg.apps.flag_spec: {hand}"


def test_positional_required_and_one_of_fields():
    """The mechanism on its own: a positional field, a required option, and flags of two fields
    in one required mutually exclusive group."""
    either = OneOf(required=True)

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Settings:
        path: str = setting(REQUIRED, Flag("path", help="a file"))
        name: str = setting(REQUIRED, Flag("--name", help="a name {{with braces}}"))
        a: str | None = setting(None, Flag("--a", exclusive=either, help="a"))
        b: str | None = setting(None, Flag("--b", exclusive=either, help="b"))

    p = argparse.ArgumentParser(prog="t", exit_on_error=True)
    add_flags(p, Settings)
    assert parse_settings(p, Settings, ["f", "--name", "n", "--b", "x"]) == Settings(path="f", name="n", b="x")
    assert "a name {with braces}" in p.format_help()
    for bad in (["f", "--name", "n"], ["f", "--name", "n", "--a", "1", "--b", "2"], ["--name", "n", "--a", "1"]):
        with pytest.raises(SystemExit) as e:
            p.parse_args(bad)
        assert e.value.code == 2
    with pytest.raises(ValueError, match="named as its field"):
        @dataclasses.dataclass
        class Misnamed:
            x: str = setting(REQUIRED, Flag("y", help="y"))

        add_flags(argparse.ArgumentParser(), Misnamed)
