"""The checksum of row names and the canonical JSON text, shared by the writers.

The output writer (:mod:`rfsgen.output`) seals every output's integrity record with
them, ``rfsgen merge`` verifies shards with them, and the ``obs`` columns carried
into an output (:mod:`rfsgen.obs`) are digested with them; they live here, below all
of these.  :mod:`rfsgen.output` re-exports both names.
"""

from __future__ import annotations

import hashlib


class NamesChecksum:
    """SHA-256 of the compact JSON array (ASCII, ``json.dumps(names, separators=(",",
    ":"))``) of a run of row names, fed in blocks."""

    def __init__(self):
        self.sha = hashlib.sha256(b"[")
        self.first = True

    def update(self, names) -> None:
        import json

        if len(names):
            text = json.dumps(list(names), separators=(",", ":"))[1:-1]
            self.sha.update((text if self.first else "," + text).encode("ascii"))
            self.first = False

    def hexdigest(self) -> str:
        sha = self.sha.copy()
        sha.update(b"]")
        return sha.hexdigest()


def canonical_json(obj) -> str:
    """The one text of ``obj`` that the record and its seal use: sorted keys, no spaces, ASCII."""
    import json

    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
