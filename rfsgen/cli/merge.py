"""``rfsgen merge``."""

from __future__ import annotations

import click

from . import _Progress, main, translate_errors
from ._budget import max_memory_option, threads_option


@main.command("merge")
@click.argument("shards", nargs=-1, required=True, metavar="SHARD.h5...")
@click.option("-o", "--output", required=True, help="The merged HDF5/AnnData file.")
@click.option("--virtual", is_flag=True,
              help="Dense shards only: make X an HDF5 virtual dataset over the shards instead of copying them. "
                   "The shards must then stay where they are (paths are stored relative to OUTPUT's directory).")
@click.option("--overwrite", is_flag=True, help="Replace OUTPUT if it exists.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@translate_errors
@max_memory_option
@threads_option
def merge_cmd(shards, output, virtual, overwrite, quiet):
    """Merge transform shards (from --rows or --shard) back into one file.

    Trusts nothing in the shards: each must be an rfsgen output with its
    integrity record (written by 'rfsgen transform' since records exist; older
    shards are refused: re-create them), and merge verifies the record's seal,
    every attribute's type, every dataset's dtype, shape and storage (no links
    or external data), one feature file, input, layout, dtype and compression,
    and row ranges that meet with no gap or overlap.  Shards are put in order
    of their first row, whatever the order given.  The data's checksums, NaN
    and infinities are checked as it is copied; a shard that fails any check
    ends the merge with one line naming it, and no output.  The result is
    identical, byte for byte, to one 'rfsgen transform' over the whole range.
    --virtual verifies the same, reading the shards once.

    \b
    Example:
      rfsgen merge part-*.h5 -o all.h5
      rfsgen merge part-*.h5 -o all.h5 --virtual     # dense shards, no copy
    """
    from ..merge import merge_files

    with _Progress(None, "rows", quiet, "merge") as bar:
        info = merge_files(list(shards), output, virtual=virtual, overwrite=overwrite, progress=bar)
    if not quiet:
        note = "; X reads the shards in place: keep them where they are" if virtual else ""
        click.echo(f"merged {info['shards']} shards: {info['rows']} rows x {info['columns']} columns to {output}{note}",
                   err=True)
