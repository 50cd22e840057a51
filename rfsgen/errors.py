"""One error hierarchy for the whole library.

The CLI maps :class:`UsageError` to exit code 2 (bad options, bad skeletons,
missing or unusable inputs named on the command line) and every other
:class:`RfsgenError` to exit code 1 (the run failed: bad values inside the rows,
a full disk, a sampler limit).  Messages are single lines that name the
object (file, line, node, row) and say how to fix the problem.
"""

from __future__ import annotations


import re

# Control characters and Unicode line breaks in user-supplied names and values would
# split a message over several lines.
_BREAKS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def one_line(message: str) -> str:
    """``message`` with control characters and line breaks escaped (\\n, \\x07, ...)."""
    return _BREAKS.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), str(message))


class RfsgenError(Exception):
    """Base class of every error rfsgen raises on purpose (exit code 1).

    The message is always one line: user-supplied text inside it is escaped.
    """

    exit_code = 1

    def __init__(self, message: str = ""):
        super().__init__(one_line(message))


class UsageError(RfsgenError, ValueError):
    """The user asked for something that cannot work as given (exit code 2).

    Also a ``ValueError``, as Python code (scikit-learn's included) expects of a bad
    argument."""

    exit_code = 2


class SkeletonError(UsageError):
    """A skeleton file is malformed or describes an invalid DAG."""


class InputError(UsageError):
    """An input file cannot be opened or does not fit the skeleton."""


class DataError(RfsgenError, ValueError):
    """Input values are invalid for the kernel (NaN/inf, out of domain, zero vectors);
    also a ``ValueError``."""


class FeatureFileError(UsageError):
    """A feature file is missing, foreign, of another version, truncated or corrupted
    (an input named on the command line that cannot be used: exit code 2)."""


class OutputError(RfsgenError):
    """An output cannot be written (exists, unwritable, disk full)."""


class OutputExistsError(UsageError):
    """The output exists and ``overwrite`` was not given."""


class LimitError(RfsgenError):
    """A run would exceed a stated bound (the memory budget, a size or time limit); the
    message names what, the estimate, the limit and how to change it (exit code 1)."""


class SamplerError(RfsgenError):
    """The sampler cannot proceed (for example the skeleton's feature space is too small)."""
