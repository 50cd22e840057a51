"""The console-script entry point: route signals before anything heavy is imported,
so Ctrl-C, SIGTERM or SIGHUP even during start-up ends with one line, not a traceback."""

from __future__ import annotations

import sys


def main() -> None:
    from . import _signals

    _signals.install()
    try:
        from .cli import main as cli_main
    except KeyboardInterrupt:
        sys.stderr.write("rfsgen: interrupted; no output was written\n")
        sys.exit(130)
    except _signals.Terminated as t:
        sys.stderr.write(f"rfsgen: terminated by {t.name}; no output was written\n")
        sys.exit(t.exit_code)
    cli_main(prog_name="rfsgen")
