"""A pickle payload: an object whose unpickling creates a marker file (``open(marker, "w")``).

Planted in a file that one of our commands loads, it shows whether the load ran code the file's
author chose: the marker exists afterwards exactly when it did.
"""
from pathlib import Path


class Payload:
    """Unpickled as ``open(marker, "w")``: the marker file appears when a load runs the pickle's code."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")
