"""``rfsgen kernel``."""

from __future__ import annotations

import click

from . import main, translate_errors, _Progress
from ._budget import max_memory_option


@main.command("kernel")
@click.argument("skeleton", type=click.Path(dir_okay=False))
@click.argument("input", metavar="INPUT")
@click.argument("input2", metavar="[INPUT2]", required=False)
@click.option("-o", "--output", required=True, help="Output .npy file for the kernel matrix ('-' for stdout).")
@click.option("--rows", help="Use only rows START:STOP of INPUT (and of INPUT2).")
@click.option("--overwrite", is_flag=True, help="Replace OUTPUT if it exists.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@translate_errors
@max_memory_option
def kernel_cmd(skeleton, input, input2, output, rows, overwrite, quiet):
    """Evaluate the exact kernel of SKELETON between rows of INPUT and INPUT2.

    Writes the float64 matrix K[i, j] = k(INPUT[i], INPUT2[j]) as .npy
    (INPUT2 defaults to INPUT).  INPUT may be .npy, .npz[:key], .h5[:/path],
    .csv/.tsv or '-' for standard input.

    \b
    Example:
      rfsgen kernel skeletons/shallow-gaussian.yaml rows.npy -o K.npy
    """
    from ..kernel import kernel_files

    with _Progress(None, "rows", quiet, "kernel") as bar:
        kernel_files(skeleton, input, input2, output, rows=rows, overwrite=overwrite, progress=bar)
