"""Input specs: ``path[:key]`` names a dataset inside a container file.

A row input is a path, or a path and the dataset in it (``data.h5ad:/X``,
``rows.npz:arr_0``).  Splitting the two is needed by the readers
(:mod:`rfsgen.inputs`) and by the writers' check that an output is not its own input
(:mod:`rfsgen.atomic`), so it lives here, below both.
"""

from __future__ import annotations

import os
import re


def _split_spec(spec: str):
    """``path[:key]`` -> (path, key or None), only splitting at a known container suffix."""
    m = re.match(r"^(.*?\.(?:npz|h5ad|h5|hdf5|hdf))(?::(.+))?$", spec, flags=re.IGNORECASE)
    if m and (m.group(2) is not None or os.path.exists(m.group(1))):
        return m.group(1), m.group(2)
    return spec, None
