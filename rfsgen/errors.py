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


def count(n, noun: str, plural: str | None = None) -> str:
    """``"1 value"``, ``"2 values"``: ``n`` and ``noun`` in the number ``n`` asks for."""
    return f"{n} {noun if n == 1 else (plural or noun + 's')}"


def article(word) -> str:
    """``"a"`` or ``"an"`` for ``word`` as it is read aloud (``an AnnData``, ``an 8-column``,
    ``an 11-value``, ``a 1-D``)."""
    w = str(word)
    digits = w[: len(w) - len(w.lstrip("0123456789"))]
    if digits:  # eight..., eleven..., eighteen... (11 and 18 thousand/million too)
        return "an" if digits[0] == "8" or (len(digits) % 3 == 2 and digits[:2] in ("11", "18")) else "a"
    return "an" if w[:1].lower() in "aeiou" and w[:1] != "" else "a"


#: The optional extras of pyproject.toml: extra -> the packages it installs.
EXTRAS = {"sklearn": "scikit-learn", "plot": "matplotlib", "dask": "dask distributed", "anndata": "anndata"}


def install_hint(extra: str) -> str:
    """How to install what the optional extra ``extra`` brings, in words that work from any
    install: the packages themselves (rfsgen is not on a package index, so
    an extra by the package's name finds nothing on an index), or the extra from a clone."""
    return f"pip install {EXTRAS[extra]} (or, in a clone of rfsgen: pip install -e '.[{extra}]')"


class RfsgenError(Exception):
    """Base class of every error rfsgen raises on purpose (exit code 1).

    The message is always one line: user-supplied text inside it is escaped.
    ``cli`` is the same message as the command line says it (its flags in place of
    Python's keywords), printed by the CLI; by default the message itself.
    """

    exit_code = 1

    def __init__(self, message: str = "", cli: str | None = None):
        super().__init__(one_line(message))
        self.cli_message = one_line(cli) if cli is not None else str(self)


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


class InputChangedError(RfsgenError):
    """An input changed while it was being read (another program truncated or rewrote
    it): the run cannot finish with what the file held when it was checked (exit code 1)."""


class OutputError(RfsgenError):
    """An output cannot be written (exists, unwritable, disk full)."""


class OutputExistsError(UsageError):
    """The output exists and ``overwrite`` was not given.  The message names the keyword
    ``overwrite=True``; :attr:`cli_message`, which the CLI prints, the flag ``--overwrite``."""


class LimitError(RfsgenError):
    """A run would exceed a stated bound (the memory budget, a size or time limit); the
    message names what, the estimate, the limit and how to change it (exit code 1)."""


class SamplerError(RfsgenError):
    """The sampler cannot proceed (for example the skeleton's feature space is too small)."""


class DeviceError(RfsgenError):
    """The device asked for is not there (``--device cuda`` without a GPU): exit code 1."""


class RfsgenWarning(UserWarning):
    """Base class of rfsgen's warnings: the run goes on, but a result may not be what the
    user expects.  One line, naming the object and the place, saying what to do; the CLI
    prints it as ``rfsgen: warning: MESSAGE`` on stderr."""


class VarianceWarning(RfsgenWarning):
    """The skeleton's random features are unbiased but their kernel estimates have
    infinite variance (a node with infinite sigma_hat'(1), such as step, above an input
    base with C > 1)."""
