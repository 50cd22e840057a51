"""The skeleton language's vocabulary and its DAG objects, below both of its users.

:mod:`rfsgen.skeleton` (parsing and validation) and :mod:`rfsgen.templates` (the
expansion of ``per:``, conv, pool, dense, each and ``width: auto``) share these: the
keys a skeleton file may hold, the limits that bound parsing and expansion, the
reference syntax and the node types the expansion builds.  Every name here is also
importable from :mod:`rfsgen.skeleton`, its public home.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from . import activations as _act
from . import bases as _bases

SCHEMA_VERSION = 1

TOP_KEYS = ("rfsgen", "description", "params", "input", "nodes", "output")
INPUT_KEYS = ("width", "shape")
COMMON_KEYS = ("name", "description")
INPUT_NODE_KEYS = ("base", "columns", "per", "group", "patch")
INTERNAL_KEYS = ("activation", "inputs", "conv", "pool", "dense", "each", "from")
WIRINGS = ("inputs", "conv", "pool", "dense", "each")
PER_VALUES = ("all", "column", "pixel", "patch", "group")

# A skeleton file is user input: parsing and expanding it is bounded in time and
# memory.  Each limit is stated in docs/reliability.md (Limits); exceeding one is a one-line error.
MAX_SOURCE_BYTES = 256 << 10  # the file itself (YAML parsing runs at ~50k values/s)
MAX_YAML_NODES = 200_000  # YAML values after expanding aliases (alias "bombs")
MAX_WIDTH = 10_000_000  # values per input row
MAX_NODES = 250_000  # skeleton nodes after expansion (a 500 x 500 image, one node per pixel)
MAX_EDGES = 20_000_000  # child references, summed over internal nodes
MAX_COLUMN_REFS = 20_000_000  # input columns referenced, summed over input nodes (overlapping patches)
MAX_DEPTH = 1_000  # internal nodes on the longest input-to-output path
MAX_NAME = 200  # characters in a node name


# ----------------------------------------------------------------------------- DAG objects
@dataclass(frozen=True)
class InputNode:
    """An input node: ``columns`` (tuple of int) of the input row through ``base``."""

    id: int
    label: str
    layer: str
    base: _bases.Base
    columns: tuple


@dataclass(frozen=True)
class InternalNode:
    """An internal node: ``activation`` of the mean of its ``children`` (node ids)."""

    id: int
    label: str
    layer: str
    activation: _act.Activation
    children: tuple


@dataclass(frozen=True)
class Layer:
    """One skeleton entry after expansion: a named array of node ids."""

    name: str
    kind: str  # input | inputs | conv | pool | dense | each
    shape: tuple
    ids: tuple  # node ids in row-major order of ``shape``
    line: int


# ----------------------------------------------------------------------------- references
REF = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_.-]*)\s*(?:\[(.*)\])?\s*\Z", re.DOTALL)

#: An unbound ``width: auto`` skeleton is checked by building it at a probe width:
#: the smallest multiple of every 'group' size that is at least this.
AUTO_PROBE_WIDTH = 64
