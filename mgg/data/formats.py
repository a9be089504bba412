"""The table of graph file formats that `load_dataset` reads by path.

A format is a loader (path -> `Graph`) plus how a path is recognised: file suffixes (matched on
the lower-cased name after one optional ``.gz``) or a probe (path -> bool; folders are recognised
by probe only). Adding a format = one module with its loader + one `register_format` line below.

``labels``/``features`` say whether files of the format can carry node labels / node features
(graphs read from a format without them have `Graph.y`/`Graph.x` None).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

from .edgelist import EDGELIST_SUFFIXES, load_edgelist
from .graph import Graph
from .npz import load_npz
from .ogb import is_ogb_folder, load_ogb

__all__ = ["DatasetFormat", "FORMATS", "register_format", "format_for", "expected_formats"]


@dataclass(frozen=True)
class DatasetFormat:
    """One readable format.

    name: short name ("npz").
    load: path -> Graph (raises GraphFormatError on a malformed file).
    describe: how messages name it ("an edge list (.txt, ...)").
    suffixes: lower-case file suffixes, e.g. (".npz",); a trailing ".gz" on the path is ignored.
    probe: path -> bool, for formats recognised by content or layout instead of suffix.
    folder: the format is a folder (recognised by `probe`), not a file.
    not_this_folder: for folder formats, the end of "folder is not ..." when no folder format matches.
    labels, features: whether the format can carry node labels / node features.
    """

    name: str
    load: Callable[[str], Graph]
    describe: str
    suffixes: tuple[str, ...] = ()
    probe: Callable[[str], bool] | None = None
    folder: bool = False
    not_this_folder: str = ""
    labels: bool = False
    features: bool = False

    def __post_init__(self):
        if self.folder and self.probe is None:
            raise ValueError(f"dataset format {self.name!r}: a folder format needs a probe")
        if not self.folder and not self.suffixes and self.probe is None:
            raise ValueError(f"dataset format {self.name!r}: needs suffixes or a probe")

    def matches(self, path: str) -> bool:
        """Whether `path` (an existing file, or folder for folder formats) is in this format."""
        if self.folder != os.path.isdir(path):
            return False
        low = path.lower()
        base = low[:-3] if low.endswith(".gz") else low
        if self.suffixes and base.endswith(self.suffixes):
            return True
        return self.probe is not None and bool(self.probe(path))


#: Registered formats, in the order they are tried (and named in messages).
FORMATS: list[DatasetFormat] = []


def register_format(fmt: DatasetFormat) -> DatasetFormat:
    """Add `fmt` to the table (its name must be new); returns it."""
    if any(f.name == fmt.name for f in FORMATS):
        raise ValueError(f"dataset format {fmt.name!r} is already registered")
    FORMATS.append(fmt)
    return fmt


def format_for(path: str) -> DatasetFormat | None:
    """The first registered format that `path` (an existing file or folder) matches, else None."""
    return next((f for f in FORMATS if f.matches(path)), None)


def expected_formats(folder: bool | None = None) -> str:
    """The formats for a message: "A, B or C" (only folder or only file formats when `folder` is set)."""
    names = [f.describe for f in FORMATS if folder is None or f.folder == folder]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


# -- the built-in formats -------------------------------------------------------------------------
register_format(DatasetFormat("npz", load_npz, ".npz", suffixes=(".npz",), labels=True, features=True))
register_format(DatasetFormat("edgelist", load_edgelist, f"an edge list ({', '.join(EDGELIST_SUFFIXES)})",
                              suffixes=EDGELIST_SUFFIXES))
register_format(DatasetFormat("ogb", load_ogb, "an ogbn-style folder", probe=is_ogb_folder, folder=True,
                              not_this_folder="an ogbn-style dataset (no raw/edge.csv[.gz] or raw/data.npz)",
                              labels=True, features=True))
