"""The registry of column kinds: which :class:`~rfsgen.featureset.ColumnKind` holds a feature set's columns.

A feature file records its ``scheme``; :data:`KINDS` maps each scheme to the kind whose
columns such a file holds (compositional paths, :mod:`rfsgen.paths`; EOF grid cells,
:mod:`rfsgen.eof`).  The generic modules find a set's kind here (:func:`of`) and talk to it
only through :class:`~rfsgen.featureset.ColumnKind`: a new kind is a module implementing it
and a line below, and no generic module changes.
"""

from __future__ import annotations

from .eof import EOF
from .errors import FeatureFileError
from .paths import PATHS

#: Every column kind, in registry order.
ALL = (PATHS, EOF)
#: scheme -> column kind (module-level singletons: a dict of plain objects, so it pickles).
KINDS = {scheme: kind for kind in ALL for scheme in kind.schemes}
#: Every scheme, in the order ``--scheme`` lists them.
SCHEMES = tuple(scheme for kind in ALL for scheme in (kind.listed or kind.schemes))
#: Every format version some kind reads, ascending.
VERSIONS = tuple(sorted({v for kind in KINDS.values() for v in kind.versions}))
#: The root attributes of the kinds' own (sealed with the others), in registry order.
ATTRIBUTES = tuple(dict.fromkeys(kind.attribute for kind in KINDS.values() if kind.attribute is not None))


def of(fs):
    """The column kind of the feature set ``fs`` (by its scheme)."""
    try:
        return KINDS[fs.scheme]
    except KeyError:
        raise FeatureFileError(f"unknown scheme {fs.scheme!r} (one of {', '.join(KINDS)})") from None


def named(scheme: str):
    """The column kind of the scheme ``scheme`` (``rfs``, ..., ``eof``)."""
    return KINDS[scheme]


def owner_of_version(version: int):
    """The column kind whose files have the format version ``version`` (one of :data:`VERSIONS`)."""
    return next(kind for kind in KINDS.values() if version in kind.versions)


def for_scheme(scheme: str):
    """The kind that samples ``scheme``: its owner; for a name no kind owns, compositional paths,
    whose sampler refuses it with the list of its schemes (as ever)."""
    return KINDS.get(scheme, PATHS)


def taking(option: str):
    """The kind whose schemes take the sampling option ``option`` (``level``, ...), or None."""
    return next((kind for kind in ALL if option in kind.options), None)
