"""The ``rfsgen`` command line: thin wrappers over the library, one module per command.

Each command parses options, makes one library call and translates
:class:`~rfsgen.errors.RfsgenError` into a one-line message on stderr with exit
code 2 (usage) or 1 (runtime).
"""

from __future__ import annotations

import contextlib
import functools
import json
import sys

import click

from .. import __version__, _signals
from ..errors import RfsgenError


def _fail(message: str, code: int):
    _signals.finish()  # the run ends here: a later signal must not interrupt this one line
    click.echo(f"rfsgen: error: {message}", err=True)
    sys.exit(code)


def _stdout_closed():
    """The reader of stdout went away (``| head``): stop quietly, as a program killed by
    SIGPIPE would (exit 141), without Python's complaint when it flushes at exit."""
    import os

    _signals.finish()
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    sys.exit(141)


def _signal_of(exc: BaseException) -> int | None:
    """The signal that ends this run: one received since the CLI started (it wins over
    any exception that followed it: h5py and numba wrap or replace an exception raised
    inside them), else the one ``exc`` stands for."""
    import signal

    from .._signals import Terminated, received

    got = received()
    if got is not None:
        return got
    if isinstance(exc, KeyboardInterrupt):
        return int(signal.SIGINT)
    if isinstance(exc, Terminated):
        return exc.signum
    return None


def translate_errors(fn):
    """Map library errors, interruptions and closed pipes to one-line messages and exit codes:
    usage errors 2, runtime errors 1, Ctrl-C 130, SIGTERM 143, SIGHUP 129, closed stdout 141."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except SystemExit:
            raise
        except BaseException as e:
            _translate(e)

    return wrapper


def _translate(e: BaseException):
    """Print the one line for ``e`` and exit with its code; re-raise what is not ours
    (a bug: its traceback is what a report needs)."""
    from ..errors import one_line

    signum = _signal_of(e)
    if signum is not None:
        _fail(_signals.message(signum), 128 + signum)
    if isinstance(e, RfsgenError):
        _fail(getattr(e, "cli_message", str(e)), e.exit_code)  # the message in the CLI's words (--overwrite)
    if isinstance(e, BrokenPipeError):
        _stdout_closed()
    if isinstance(e, click.exceptions.NoArgsIsHelpError):  # bare 'rfsgen': the usage and commands, as click shows them
        _signals.finish()
        e.show()
        sys.exit(e.exit_code)
    if _click_wrote_stdout(e):  # its --help or --version to a full or failing stdout
        from ..atomic import stdout_failed

        _fail(stdout_failed(e).cli_message, 1)
    if isinstance(e, MemoryError):  # numpy's _ArrayMemoryError too: an allocation the budget did not foresee
        _fail(_out_of_memory(e), 1)
    if isinstance(e, click.UsageError):
        where = f" (see '{e.ctx.command_path} --help')" if e.ctx is not None else ""
        _fail(one_line(e.format_message()) + where, 2)
    if isinstance(e, click.ClickException):
        _fail(one_line(e.format_message()), e.exit_code)
    if isinstance(e, click.Abort):
        _fail("interrupted; no output was written", 130)
    raise e


def _click_wrote_stdout(e: BaseException) -> bool:
    """Whether ``e`` is an OSError of click's own ``echo`` writing to stdout (``--help``,
    ``--version``; rfsgen's output goes through :func:`rfsgen.atomic.write_stdout`)."""
    if not isinstance(e, OSError) or e.__traceback__ is None:
        return False
    tb = e.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    frame = tb.tb_frame
    if frame.f_code.co_name != "echo" or frame.f_globals.get("__name__") != "click.utils":
        return False
    try:
        return frame.f_locals.get("file").fileno() == sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return False


def _out_of_memory(e: MemoryError) -> str:
    """The one line for a :class:`MemoryError` that escaped a command: the command, what
    failed to allocate (numpy's message, when it has one) and the options that make the
    run smaller.  The output's temporary file is removed on the way out (atomic_path)."""
    from ..errors import one_line

    ctx = click.get_current_context(silent=True)
    command = "rfsgen" if ctx is None or ctx.command is None or ctx.parent is None else f"rfsgen {ctx.info_name}"
    options = set() if ctx is None or ctx.command is None else {p.name for p in ctx.command.params}
    detail = " ".join(str(e).split())[:200]
    fixes = ["a smaller --max-memory (the budget that rfsgen sizes its work to and checks its estimates against)"]
    if "chunk_rows" in options:
        fixes.append("a smaller --chunk-rows")
    if "rows" in options:
        fixes.append("fewer rows (--rows START:STOP)")
    return one_line(f"{command}: ran out of memory{f' ({detail})' if detail else ''}; "
                    f"give {', or '.join(fixes)}, or run it where more memory is free")


class _Progress:
    """A tqdm bar on stderr, silent when stderr is not a terminal or with --quiet.

    The library reports work with ``progress(n)`` and may announce a total or a new
    phase (e.g. sampling, then writing the file) with ``progress.phase(name, total)``.
    """

    def __init__(self, total, unit, quiet, desc):
        self.bar = None
        if not quiet and sys.stderr.isatty():
            from tqdm import tqdm

            # unit_scale off: counts are whole rows and columns ('35/400 rows', not '35.0/400')
            self.bar = tqdm(total=total, unit=unit, unit_scale=False, desc=desc, file=sys.stderr, leave=False)

    def __call__(self, n):
        if self.bar is not None:
            self.bar.update(n)

    def phase(self, name, total):
        if self.bar is not None:
            self.bar.reset(total=total)
            self.bar.set_description(name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.close()


def echo(text: str = "") -> None:
    """A line of a command's output on stdout, written through the checked writer
    (:func:`rfsgen.atomic.write_stdout`: a short write, a closed pipe or a full device
    is never passed over)."""
    from ..atomic import write_stdout

    write_stdout(f"{text}\n")


def _emit_json(obj):
    echo(json.dumps(obj, indent=2, sort_keys=False, default=float))


@contextlib.contextmanager
def _warnings_as_lines():
    """rfsgen's own warnings (:class:`~rfsgen.errors.RfsgenWarning`) as one line each on
    stderr, ``rfsgen: warning: MESSAGE``; other warnings as Python shows them."""
    import warnings

    from ..errors import RfsgenWarning, one_line

    with warnings.catch_warnings():
        shown = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):
            if isinstance(category, type) and issubclass(category, RfsgenWarning):
                click.echo(f"rfsgen: warning: {one_line(message)}", err=True)
            else:
                shown(message, category, filename, lineno, file, line)

        warnings.showwarning = show
        warnings.simplefilter("default", RfsgenWarning)  # once per message, whatever the filters say
        yield


class _Group(click.Group):
    """The whole command line, from parsing the arguments to the last line, under one
    translation: click's usage errors as one line with exit code 2, and a signal at any
    moment (parsing included) as one line with 128 + N.

    Not click's ``main``: it turns KeyboardInterrupt into ``Abort`` after writing an
    empty line to stderr, and lets SIGTERM's exception through."""

    def main(self, args=None, prog_name=None, complete_var=None, **extra):
        extra.pop("standalone_mode", None)
        try:
            args = sys.argv[1:] if args is None else list(args)
            prog_name = prog_name or "rfsgen"
            self._main_shell_completion(extra, prog_name, complete_var)
            _signals.reached("parse")
            with _warnings_as_lines(), self.make_context(prog_name, args, **extra) as ctx:
                self.invoke(ctx)
        except click.exceptions.Exit as e:  # --help, --version
            _signals.finish()
            sys.exit(e.exit_code)
        except SystemExit:
            raise
        except BaseException as e:
            _translate(e)
        sys.exit(0)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="rfsgen")
def main():
    """Random features for compositional kernels.

    \b
    Describe a kernel as a YAML computation skeleton, then:
      rfsgen skeletons                                    # the shipped skeletons
      rfsgen skeleton cifar-deep                          # validate and describe
      rfsgen kernel cifar-deep rows.npy -o K.npy
      rfsgen sample cifar-deep -n 10000 --seed 1 -o feats.h5
      rfsgen transform feats.h5 rows.npy -o out.h5

    SKELETON is a YAML file or a shipped skeleton's name (a file that exists wins).
    """


# One module per command (as rasterio's rio does); importing them registers the commands.
from . import approx, inspect, kernel, merge, sample, select, skeleton, transform  # noqa: E402,F401  (pyflakes: registers)

if __name__ == "__main__":  # pragma: no cover
    main()
