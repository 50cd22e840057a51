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
    if "eof" in info:  # EOF columns have no terms: the grid instead
        e = info["eof"]
        rows += [
            ("eof", f"{e['kernel']} node '{e['node']}', level {e['level']}: {e['level_vectors']} level vectors, "
                    f"{e['grid_features']} features in the grid, {info['columns']} kept"),
            ("non-zeros", f"at most {e['max_nonzeros_per_row']} per row (one per level vector used), "
                          f"{e['expected_nonzeros_per_row']:.1f} expected for rows spread over the box"),
            ("domain", f"{e['domain_source']}" + (f", widened by {e['margin']:g} of each column's range on each side"
                                                  if e["margin"] is not None else "")),
        ]
    else:
        rows += [
            ("features", f"{info['features']} distinct term sets"),
            ("draws", f"{info['draws']} (dedup ratio q/D = {info['dedup_ratio']:.3f})"),
            ("constant", f"weight {info['constant_weight']:.6f}"),
            ("weights", "count / draws per column" if info["column_weights"] == "counts"
             else "float column weights (/column_weight)"),
            ("terms", f"mean {info['mean_terms']:.3f} per column, max {info['max_terms']}"),
            # A feature set made in code and saved may carry no sampler statistics.
            ("factors", (f"mean {info['mean_factors_per_draw']:.4f} per draw before combining"
                         if info["mean_factors_per_draw"] is not None else "not recorded")
             + f"; C(S) = {info['complexity']:.4g}"),
            ("out degree", " ".join(f"{i}:{c}" for i, c in enumerate(info["output_degree_histogram"] or []) if c)
             if info["output_degree_histogram"] is not None else "not recorded"),
            ("input nodes", f"{info['input_nodes_used']} of {info['input_nodes']} used; most used: "
             + ", ".join(f"{t['node']} ({t['terms']})" for t in info["top_input_nodes"])),
        ]
    if "eof" in info:
        text = f"{dens['density']:.3f} expected (the expected non-zeros of a row over the columns)"
    else:
        sure, D = dens["nonzero_columns"], dens["columns"]
        d = dens["density"]
        shown = f"{d:.3f}" if d >= 0.001 or d == 0 else f"{d:.2g}"
        text = (f"at least {shown} expected ({sure} of {D} columns almost surely non-zero"
                + ("; the others vanish where their sphere 'coordinate' or brownian inputs are zero" if sure < D else "")
                + ")")
    rows.append(("density", f"{text}; --layout auto writes {dens['layout']}"))
    rows.append(("command", info["command"]))
    for k, v in rows:
        echo(f"{k:<12} {v}")
