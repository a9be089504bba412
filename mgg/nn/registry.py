"""The model registry: one entry per model name, read by the CLI (mgg.apps), the benchmarks and
the tests. Adding a model is one `register_model(...)` call next to its class (mgg/nn/models.py);
a sampled mini-batch twin attaches itself with `register_sampled_model(...)` (mgg/nn/sampled.py).

This module imports nothing from the rest of mgg.nn: the model files import it.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, Callable

__all__ = ["ModelDefaults", "ModelEntry", "register_model", "register_sampled_model", "model_entry",
           "model_names", "tunable_models", "sampled_models", "RegistryView", "AGGREGATION_KINDS"]

#: aggregation kinds of DistGraph.aggregate (a plan per kind), the ones the runtime tuner times
AGGREGATION_KINDS = ("gcn", "sum", "mean", "sum_self")


@dataclass(frozen=True)
class ModelDefaults:
    """Per-model hyperparameter defaults (used by the CLI when a flag is not given)."""

    hidden: int
    layers: int
    dropout: float
    lr: float
    weight_decay: float


@dataclass(frozen=True)
class ModelEntry:
    """What the CLI, the benchmarks and the tests know about one model.

    model: the full-graph class, called as model(in_dim, hidden, out_dim, layers, dropout).
    aggregation: the DistGraph aggregation kind its layers run through the plan ("gcn" | "sum" |
        "mean"), or None when its aggregation does not use the plan (GAT: fused attention).
    supports_tune: whether `--tune` applies (the tuner times aggregations of `aggregation`).
    sampled_model: the mini-batch class of `--mode sampled` (None: full-graph only).
    """

    name: str
    model: type
    aggregation: str | None
    defaults: ModelDefaults
    supports_tune: bool
    sampled_model: type | None = None

    @property
    def supports_sampled(self) -> bool:
        """Whether `--mode sampled` trains this model (it has a sampled twin)."""
        return self.sampled_model is not None


_ENTRIES: dict[str, ModelEntry] = {}


def register_model(name: str, model: type, *, aggregation: str | None, defaults: ModelDefaults,
                   supports_tune: bool | None = None) -> ModelEntry:
    """Register `model` under `name` (lower case). `supports_tune` defaults to whether the model
    aggregates through the plan (`aggregation` given). ValueError on a duplicate name, an unknown
    aggregation kind, or tuning asked for without a plan aggregation."""
    if not name or name != name.lower():
        raise ValueError(f"model names are non-empty lower case, got {name!r}")
    if name in _ENTRIES:
        raise ValueError(f"model {name!r} is already registered ({_ENTRIES[name].model.__name__})")
    if aggregation is not None and aggregation not in AGGREGATION_KINDS:
        raise ValueError(f"aggregation of {name!r} must be one of {AGGREGATION_KINDS} or None, got {aggregation!r}")
    tune = aggregation is not None if supports_tune is None else bool(supports_tune)
    if tune and aggregation is None:
        raise ValueError(f"model {name!r}: tuning needs a plan aggregation kind")
    entry = ModelEntry(name, model, aggregation, defaults, tune)
    _ENTRIES[name] = entry
    return entry


def register_sampled_model(name: str, sampled_model: type) -> ModelEntry:
    """Attach the mini-batch class of `--mode sampled` to the registered model `name`."""
    entry = model_entry(name)
    if entry.sampled_model is not None:
        raise ValueError(f"model {name!r} already has a sampled model ({entry.sampled_model.__name__})")
    _ENTRIES[name] = entry = replace(entry, sampled_model=sampled_model)
    return entry


def model_entry(name: str) -> ModelEntry:
    """The entry of `name` (case-insensitive); ValueError naming the registered models."""
    entry = _ENTRIES.get(str(name).lower())
    if entry is None:
        raise ValueError(f"unknown model {name!r}; expected one of {sorted(_ENTRIES)}")
    return entry


def model_names() -> tuple[str, ...]:
    """Registered model names, in registration order."""
    return tuple(_ENTRIES)


def tunable_models() -> tuple[str, ...]:
    """Models that `--tune` applies to."""
    return tuple(n for n, e in _ENTRIES.items() if e.supports_tune)


def sampled_models() -> tuple[str, ...]:
    """Models that `--mode sampled` trains."""
    return tuple(n for n, e in _ENTRIES.items() if e.supports_sampled)


class RegistryView(Mapping):
    """A read-only, always current mapping name -> `pick(entry)` over the registered models
    (optionally only those `keep(entry)` accepts): MODELS, MODEL_DEFAULTS, SAMPLED_MODELS."""

    def __init__(self, pick: Callable[[ModelEntry], Any], keep: Callable[[ModelEntry], bool] = lambda e: True):
        self._pick, self._keep = pick, keep

    def __getitem__(self, name: str) -> Any:
        entry = _ENTRIES.get(name)
        if entry is None or not self._keep(entry):
            raise KeyError(name)
        return self._pick(entry)

    def __iter__(self) -> Iterator[str]:
        return iter([n for n, e in _ENTRIES.items() if self._keep(e)])

    def __len__(self) -> int:
        return sum(1 for e in _ENTRIES.values() if self._keep(e))

    def __repr__(self) -> str:
        return repr(dict(self))
