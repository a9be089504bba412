"""One source of truth for configuration: the flags of `mgg.train` are TrainConfig's declared fields,
the plan knobs' defaults and ranges are mgg.knobs' (for the flags and the runtime alike), and
each constant with a literal value is defined in one module."""
from __future__ import annotations

import argparse
import ast
import dataclasses

import pytest

from mgg.apps.args import build_parser, parse_args
from mgg.apps.config import PER_RUN_KEYS, SAMPLED_FLAGS, TrainConfig
from mgg.apps.flag_spec import SAME, Flag, IntRange, add_flags, flags_of, internal_fields, setting
from mgg.knobs import KNOB_DEFAULTS, KNOB_RANGES

from mgg.testing.paths import ROOT


def _actions() -> dict[str, list[argparse.Action]]:
    """dest -> the parser's actions that set it (flags only, -h/--help left out)."""
    out: dict[str, list[argparse.Action]] = {}
    for a in build_parser()._actions:
        if a.option_strings and a.dest != "help":
            out.setdefault(a.dest, []).append(a)
    return out


def test_every_field_has_a_flag_or_is_internal():
    actions = _actions()
    internal = internal_fields(TrainConfig)
    for f in dataclasses.fields(TrainConfig):
        has_flag = f.name in actions
        assert has_flag != (f.name in internal), f"{f.name}: a flag, or internal=True, one of the two"
    assert set(actions) <= {f.name for f in dataclasses.fields(TrainConfig)}, "a flag sets no TrainConfig field"


def test_flag_defaults_are_the_field_defaults():
    """The parser's default is the field's, except where the field declares another one that
    parse_args resolves (None: "not given"); without flags, parse_args gives TrainConfig()."""
    actions = _actions()
    for field, flags in flags_of(TrainConfig):
        for flag, action in zip(flags, actions[field.name]):
            if flag.default is SAME and action.default is not argparse.SUPPRESS:
                assert action.default == field.default, f"--{field.name}: {action.default!r} != {field.default!r}"
    assert parse_args([]) == TrainConfig()


def test_the_derived_tables_come_from_the_declarations():
    sampled = {f.name for f in dataclasses.fields(TrainConfig) if f.metadata.get("sampled_only")}
    assert set(SAMPLED_FLAGS) == sampled and SAMPLED_FLAGS["reorder"] == "--reorder/--no-reorder"
    assert {"metrics_json", "checkpoint_dir", "verbosity"} <= PER_RUN_KEYS and "epochs" not in PER_RUN_KEYS


@pytest.mark.parametrize("name", sorted(KNOB_RANGES))
def test_knob_flags_check_the_runtime_range(name, capsys):
    """--ps/--dist/--wpb/--ps-inter refuse exactly what PlanParams refuses, with the same range."""
    from mgg.runtime.plan import PlanParams

    lo, hi = KNOB_RANGES[name]
    flag = f"--{name.replace('_', '-')}"
    for good in (lo, hi):
        assert getattr(parse_args([flag, str(good)]), name) == good
        PlanParams(**{name: good})
    with pytest.raises(SystemExit) as e:
        parse_args([flag, str(hi + 1)])
    assert e.value.code == 2
    assert f"argument {flag}: must be an integer in [{lo}, {hi}], got {hi + 1}" in capsys.readouterr().err
    with pytest.raises(ValueError, match=rf"{name} must be an integer in \[{lo}, {hi}\]"):
        PlanParams(**{name: hi + 1})


def test_knob_defaults_are_one_set():
    from mgg.graph.dist_graph import RuntimeConfig
    from mgg.runtime.plan import PlanParams

    assert dataclasses.asdict(PlanParams()) == {**KNOB_DEFAULTS, "ps_inter": None}
    rc = RuntimeConfig()
    assert {k: getattr(rc, k) for k in KNOB_DEFAULTS} == KNOB_DEFAULTS
    assert TrainConfig().knobs() == KNOB_DEFAULTS
    text = build_parser().format_help()
    for k, v in KNOB_DEFAULTS.items():
        lo, hi = KNOB_RANGES[k]
        assert f"[{lo}, {hi}] (default {v};" in text


def test_a_declared_field_becomes_a_flag():
    """The mechanism on its own: a field declared with setting() is a flag of the built parser, with
    its range and default; a field without flags must say it is internal."""
    @dataclasses.dataclass
    class Settings:
        width: int = setting(8, Flag("--width", type=IntRange(1, 64), help="width [{lo}, {hi}] (default {default})"))
        cache: dict = setting(None, internal=True)

    p = argparse.ArgumentParser()
    add_flags(p, Settings)
    assert p.parse_args([]).width == 8 and p.parse_args(["--width", "64"]).width == 64
    assert "width [1, 64] (default 8)" in p.format_help()
    assert not hasattr(p.parse_args([]), "cache")
    with pytest.raises(ValueError, match="internal"):
        setting(1)


#: constants that must have one defining module (an alias such as `X = Y` is not a definition)
ONE_HOME = ("MAX_DIM_PADDED", "CSR_ROWS_MAX_DIM_PADDED", "MAX_DIM_16", "KNOB_DEFAULTS", "KNOB_RANGES", "BACKENDS",
            "STORAGE_DTYPE_NAMES", "INT_BYTES", "FLOAT_BYTES", "DEFAULT_TUNE_CACHE", "DEFAULT_FANOUT",
            "DEFAULT_BATCH_SIZE")


def test_each_constant_is_defined_once():
    homes: dict[str, list[str]] = {}
    for path in sorted((ROOT / "mgg").rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                literal = any(isinstance(n, ast.Constant) for n in ast.walk(node.value))
                for t in targets:
                    if isinstance(t, ast.Name) and t.id in ONE_HOME and literal:
                        homes.setdefault(t.id, []).append(path.relative_to(ROOT).as_posix())
    twice = {k: v for k, v in homes.items() if len(v) > 1}
    assert not twice, f"constants defined in more than one module: {twice}"
    assert set(homes) == set(ONE_HOME)


def test_row_width_limits_are_the_launchers_limits():
    """The limits in mgg.kernels.variants are what the lane layouts accept."""
    from mgg.kernels.csr_rows import CSR_ROWS_MAX_DIM_PADDED as CSR_MAX, lanes_for_width
    from mgg.kernels.variants import CSR_ROWS_MAX_DIM_PADDED, MAX_DIM_PADDED, lane_layout

    assert CSR_MAX == CSR_ROWS_MAX_DIM_PADDED == 512 and MAX_DIM_PADDED == 1024
    lanes_for_width(CSR_ROWS_MAX_DIM_PADDED)
    with pytest.raises(ValueError, match="512"):
        lanes_for_width(CSR_ROWS_MAX_DIM_PADDED + 4)
    assert lane_layout(MAX_DIM_PADDED) == (32, 8)
    with pytest.raises(ValueError, match="1024"):
        lane_layout(MAX_DIM_PADDED + 4)
