"""The ``--set NAME=VALUE`` option of the commands that take a skeleton: values for the
parameters the skeleton declares (``params:``; see docs/parameters.md)."""

from __future__ import annotations

import click

HELP = ("Set a parameter the skeleton declares under 'params:' (repeatable), e.g. --set scale=0.3; "
        "unset ones take their defaults.")


def _parse(ctx, param, values):
    out = {}
    for item in values or ():
        name, eq, value = item.partition("=")
        name = name.strip()
        if not eq or not name or not value.strip():
            raise click.BadParameter(f"expected NAME=VALUE, got {item!r}")
        if name in out:
            raise click.BadParameter(f"parameter '{name}' is set twice; set it once")
        out[name] = value.strip()
    return out


def set_option(fn):
    """Add ``--set NAME=VALUE`` (repeatable) to a command; it receives ``params``, a dict
    of names to value texts (the library converts and checks them against the file)."""
    return click.option("--set", "params", metavar="NAME=VALUE", multiple=True, callback=_parse, help=HELP)(fn)

