"""``rfsgen kernel``."""

from __future__ import annotations

import click

from . import main, translate_errors, _Progress
from ._budget import max_memory_option, threads_option
from ._params import set_option


@main.command("kernel")
@click.argument("skeleton", type=click.Path(dir_okay=False))
@click.argument("input", metavar="INPUT")
@click.argument("input2", metavar="[INPUT2]", required=False)
@click.option("-o", "--output", required=True, help="Output .npy file for the kernel matrix ('-' for stdout).")
@click.option("--rows", help="Use only rows START:STOP of INPUT (and of INPUT2).")
@click.option("--overwrite", is_flag=True, help="Replace OUTPUT if it exists.")
@click.option("--eof", "eof_limit", is_flag=True, help="The kernel --scheme eof converges to: laplace pinned on the "
              "node's box (or brownian), for a skeleton of one laplace or brownian node.")
@click.option("--domain-from", "domain_from", metavar="ROWS", help="--eof: the box measured from these rows.")
@click.option("--margin", type=float, help="--eof: with --domain-from, the widening (default 0.05).")
@set_option
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@translate_errors
@max_memory_option
@threads_option
def kernel_cmd(skeleton, input, input2, output, rows, eof_limit, domain_from, margin, params, overwrite, quiet):
    """Evaluate the exact kernel of SKELETON between rows of INPUT and INPUT2.

    Writes the float64 matrix K[i, j] = k(INPUT[i], INPUT2[j]) as .npy
    (INPUT2 defaults to INPUT).  INPUT may be .npy, .npz[:key], .h5[:/path],
    .csv/.tsv or '-' for standard input.  SKELETON is a YAML file or a shipped
    skeleton's name (see 'rfsgen skeletons').

    \b
    Example:
      rfsgen kernel shallow-gaussian rows.npy -o K.npy
      rfsgen kernel laplace.yaml rows.npy --eof --domain-from train.npy -o K.npy
    """
    from ..errors import UsageError
    from ..kernel import kernel_files

    eof = None
    if eof_limit:
        from ..eof import limit_name, spec_of
        from ..skeleton import load_skeleton

        eof = {"domain_from": domain_from, "margin": margin}
        if not quiet:
            spec = spec_of(load_skeleton(skeleton, params=params))
            click.echo(f"kernel: {limit_name(spec.kernel, spec.boundary)} (the limit of --scheme eof)", err=True)
    elif domain_from is not None or margin is not None:
        raise UsageError("--domain-from and --margin are for --eof")
    with _Progress(None, "rows", quiet, "kernel") as bar:
        k = kernel_files(skeleton, input, input2, output, rows=rows, overwrite=overwrite, progress=bar, eof=eof,
                         params=params)
    if not quiet:
        click.echo(f"wrote the {k.shape[0]} x {k.shape[1]} kernel matrix (float64 .npy) to "
                   f"{'standard output' if output == '-' else output}", err=True)
