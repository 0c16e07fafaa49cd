"""The source tree's version, in the bottom layer: what a store's run log and ``foal-pipe --version`` record
without importing the package facade (``foal_pipe``, which sits above every layer)."""

__version__ = "0.1.0"
