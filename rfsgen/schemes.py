"""Baseline sampling schemes, written as rewrites of the skeleton.

``rr``: wherever a node's kernel is exactly a Gaussian on the concatenation of
its unit-normalized children -- an ``exp(beta)`` node whose children are all
sphere input nodes of the same width d -- the node becomes one input node with
a ``gaussian`` base over the concatenated columns, normalized in blocks of d,
with scale ``a = sqrt(beta / fan_in)``:

    exp(beta (mean_i <x_i^, x_i'^> - 1)) = exp(-(beta / fan_in) |P^ - P'^|^2 / 2)

so the walk stops there and draws one Rahimi-Recht factor ``e^{i a <omega, P^>}``
with ``omega ~ N(0, I)``.  On ``shallow-gaussian.yaml`` this is exactly
Rahimi-Recht; on ``cifar-deep.yaml`` it is the paper's RFS+RR hybrid (every conv1
node).  ``orf`` is the same rewrite with orthogonal random features (Yu et al.
2016) for the frequencies that share a node, and, as in that paper, both phases
([cos, sin]) of every frequency: D columns use D/2 frequencies.  The rewritten skeleton has the
same exact kernel; the feature file stores the original skeleton and the
scheme, and the rewrite is re-derived on load.

``orf`` also applies to ``gaussian`` input nodes on raw inputs (the seed 002's ORF
baseline): in a skeleton with no exp-over-sphere node, every gaussian input node draws
its frequencies as orthogonal random features (the base's ``orthogonal`` flag), with
both phases of every frequency as above.  A skeleton that has exp-over-sphere nodes is
rewritten exactly as before (its other gaussian nodes keep iid frequencies), so files
sampled before this extension keep their bytes.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from .bases import make_base
from .errors import UsageError
from .skeleton import InputNode, InternalNode, Layer, Skeleton

SCHEMES = ("rfs", "rr", "orf", "strat", "exact")
#: Schemes that walk the skeleton as written (strat and exact change how the walk draws, not
#: what it walks; exact enumerates degrees 0 and 1, :mod:`rfsgen.exact`).
WALK_AS_WRITTEN = ("rfs", "strat", "exact")


def rr_nodes(skel: Skeleton) -> list:
    """Ids of the nodes the ``rr``/``orf`` rewrite replaces."""
    out = []
    for n in skel.internal_nodes:
        if n.activation.name != "exp":
            continue
        kids = [skel.nodes[c] for c in n.children]
        if all(isinstance(k, InputNode) and k.base.name == "sphere" for k in kids):
            if len({k.base.width for k in kids}) == 1 and len(set(n.children)) == len(n.children):
                out.append(n.id)
    return out


def gaussian_nodes(skel: Skeleton) -> list:
    """Ids of the ``gaussian`` input nodes (raw inputs), which ``orf`` draws orthogonally
    when the skeleton has no :func:`rr_nodes`."""
    return [n.id for n in skel.nodes if isinstance(n, InputNode) and n.base.name == "gaussian"]


def _orthogonal_gaussians(skel: Skeleton, ids: list) -> Skeleton:
    """``skel`` with the gaussian input nodes ``ids`` flagged ``orthogonal`` (same kernel,
    same node ids and layers: only how their frequencies are drawn changes)."""
    nodes = list(skel.nodes)
    for i in ids:
        n = nodes[i]
        params = dict(n.base.params)
        params["orthogonal"] = True
        nodes[i] = InputNode(n.id, n.label, n.layer, make_base("gaussian", params, n.base.width), n.columns)
    return dataclasses.replace(skel, nodes=tuple(nodes))


@functools.lru_cache(maxsize=32)
def _apply(skel: Skeleton, scheme: str) -> Skeleton:
    targets = set(rr_nodes(skel))
    if not targets and scheme == "orf" and gaussian_nodes(skel):
        return _orthogonal_gaussians(skel, gaussian_nodes(skel))
    if not targets:
        if scheme == "orf":
            raise UsageError(
                f"scheme 'orf' applies to no node of '{skel.path}': it needs a gaussian input node or an exp node "
                "whose inputs are all sphere input nodes (a Gaussian kernel); use --scheme rfs"
            )
        raise UsageError(
            f"scheme '{scheme}' applies to no node of '{skel.path}': it needs an exp node whose inputs are all "
            "sphere input nodes (a Gaussian on normalized inputs); use --scheme rfs"
        )
    nodes = list(skel.nodes)
    for i in targets:
        n = nodes[i]
        kids = [skel.nodes[c] for c in n.children]
        d = kids[0].base.width
        beta = dict(n.activation.params)["beta"]
        cols = tuple(c for k in kids for c in k.columns)
        base = make_base("gaussian", {"scale": math.sqrt(beta / len(kids)), "normalize_blocks": d,
                                      "orthogonal": scheme == "orf"}, len(cols))
        nodes[i] = InputNode(n.id, n.label, n.layer, base, cols)
    # Keep what the output still reaches, renumbered in the same (topological) order.
    keep = np.zeros(len(nodes), dtype=bool)
    keep[skel.output] = True
    for n in reversed(nodes):
        if keep[n.id] and isinstance(n, InternalNode):
            keep[list(n.children)] = True
    new_id = np.cumsum(keep) - 1
    out = []
    for n in nodes:
        if not keep[n.id]:
            continue
        if isinstance(n, InputNode):
            out.append(InputNode(int(new_id[n.id]), n.label, n.layer, n.base, n.columns))
        else:
            out.append(InternalNode(int(new_id[n.id]), n.label, n.layer, n.activation,
                                    tuple(int(new_id[c]) for c in n.children)))
    layers = []
    for layer in skel.layers:
        ids = tuple(int(new_id[i]) for i in layer.ids if keep[i])
        if ids:
            kind = "rr" if any(i in targets for i in layer.ids) else layer.kind
            layers.append(Layer(layer.name, kind, layer.shape if len(ids) == len(layer.ids) else (len(ids),), ids, layer.line))
    return Skeleton(source=skel.source, path=skel.path, width=skel.width, shape=skel.shape, nodes=tuple(out),
                    output=int(new_id[skel.output]), layers=tuple(layers), description=skel.description,
                    unused_inputs=skel.unused_inputs)


def apply_scheme(skel: Skeleton, scheme: str) -> Skeleton:
    """The skeleton the sampler walks for ``scheme`` (``rfs`` returns ``skel`` itself)."""
    if scheme not in SCHEMES:
        raise UsageError(f"unknown scheme '{scheme}' (allowed: {', '.join(SCHEMES)})")
    if scheme in WALK_AS_WRITTEN:
        return skel
    return _apply(skel, scheme)
