"""Settings that several command-line tools share, declared once: the flag's name, default, type
and choices live here; each tool passes the help that says what the setting does there.

    dataset graph   --scale, --seed, --undirected, --reorder-nodes (mgg.train, mgg.prepare, mgg.predict)
    where it runs   --backend (mgg.train, mgg.predict, mgg.doctor, mgg.serve), --ranks-per-node
                    (mgg.train, mgg.doctor)
    outputs         --force (mgg.train, mgg.prepare, mgg.predict, mgg.export)

Each function returns a dataclass field (mgg.apps.flag_spec.setting). A tool whose flag checks a
range the others check later passes its own `type` (mgg.train's IntRange and FloatRange).
"""
from __future__ import annotations

from typing import Any, Callable

from ..knobs import BACKENDS
from .flag_spec import SAME, Flag, setting

__all__ = ["DEFAULT_SEED", "DEFAULT_SCALE", "reorder_choices", "seed_setting", "scale_setting", "undirected_setting",
           "reorder_nodes_setting", "backend_setting", "ranks_per_node_setting", "force_setting"]

#: --seed when not given: the generators', the weights' and the splits' seed
DEFAULT_SEED = 0
#: --scale when not given: a generated dataset at its full size
DEFAULT_SCALE = 1.0


def reorder_choices() -> tuple[str, ...]:
    """--reorder-nodes: "auto" and the orders of mgg.data.reorder (imported when a parser is built)."""
    from ..data.reorder import METHODS

    return ("auto", *METHODS)


def seed_setting(help: str, type: Callable = int) -> Any:  # noqa: A002
    return setting(DEFAULT_SEED, Flag("--seed", type=type, help=help))


def scale_setting(help: str, type: Callable = float, parser_default: Any = SAME) -> Any:  # noqa: A002
    """--scale: the size factor of a generated dataset; `parser_default` None lets the tool tell
    "not given" from 1.0."""
    return setting(DEFAULT_SCALE, Flag("--scale", type=type, default=parser_default, help=help))


def undirected_setting(help: str) -> Any:  # noqa: A002
    return setting(False, Flag("--undirected", action="store_true", help=help))


def reorder_nodes_setting(help: str) -> Any:  # noqa: A002
    return setting("auto", Flag("--reorder-nodes", choices=reorder_choices, help=help))


def backend_setting(help: str, choices: tuple[str, ...] = BACKENDS, default: str = "auto") -> Any:  # noqa: A002
    """--backend: BACKENDS ("auto" picks the GPU when it is usable); a tool without "auto" passes
    the backends it offers and its default."""
    if not set(choices) <= set(BACKENDS) or default not in choices:
        raise ValueError(f"--backend choices {choices} / default {default!r} are not among {BACKENDS}")
    return setting(default, Flag("--backend", choices=choices, help=help))


def ranks_per_node_setting(help: str, type: Callable = int, **flag: Any) -> Any:  # noqa: A002
    """--ranks-per-node: None groups the ranks that share memory (mgg.runtime)."""
    return setting(None, Flag("--ranks-per-node", type=type, help=help, **flag))


def force_setting(help: str) -> Any:  # noqa: A002
    return setting(False, Flag("--force", action="store_true", help=help))
