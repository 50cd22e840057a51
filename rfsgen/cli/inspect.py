"""``rfsgen inspect``."""

from __future__ import annotations

import click

from . import echo, main, translate_errors, _emit_json
from ._budget import max_memory_option


@main.command("inspect")
@click.argument("features", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output with stable keys.")
@click.option("--plot-cooccurrence", "plot_path", metavar="OUT.png",
              help="Also draw how often 4 pixels appear in features together with every other pixel "
                   "(the paper's Figure 4; image skeletons; needs matplotlib).")
@click.option("--overwrite", is_flag=True, help="Replace the --plot-cooccurrence file if it exists.")
@translate_errors
@max_memory_option
def inspect_cmd(features, as_json, plot_path, overwrite):
    """Summarise a feature file: columns, draws, dedup ratio, terms, node usage,
    the expected density of its features and the layout 'transform --layout auto'
    writes for them.

    \b
    Example:
      rfsgen inspect feats.h5 --json
      rfsgen inspect feats.h5 --plot-cooccurrence cooc.png
    """
    from ..features import describe, load
    from ..kinds import of as kind_of

    fs = load(features)
    if plot_path:
        from ..cooccurrence import plot_cooccurrence
        from ..atomic import atomic_path

        with atomic_path(plot_path, overwrite, inputs=[features]) as tmp:
            plot_cooccurrence(fs, tmp, title=f"{fs.skeleton.path}: {fs.columns} features")
    from ..output import expected_density

    info = describe(fs, features)
    dens = expected_density(fs)
    info["expected_density"] = dens["density"]  # what --layout auto decides from (rfsgen.output.auto_layout)
    info["auto_layout"] = dens["layout"]
    if as_json:
        _emit_json(info)
        return
    rows = [
        ("file", f"{info['path']} ({info['file_bytes']} bytes, {info['bytes_per_column']:.2f} bytes/column)"),
        ("skeleton", info["skeleton"] + ("; params " + ", ".join(f"{k} = {v:g}" for k, v in info["params"].items())
                                         if info.get("params") else "")),
        ("sampler", f"scheme {info['scheme']}, seed {info['seed']}, rfsgen {info['tool_version']}"),
        ("columns", f"{info['columns']} ({info['kinds']['real']} real, {info['kinds']['cos']} cos, {info['kinds']['sin']} sin)"),
    ]
    kind = kind_of(fs)  # its own lines (EOF columns have no terms: the grid instead)
    rows += kind.inspect_rows(info)
    text = kind.density_text(dens)
    rows.append(("density", f"{text}; --layout auto writes {dens['layout']}"))
    rows.append(("command", info["command"]))
    for k, v in rows:
        echo(f"{k:<12} {v}")
