"""The library's version (the ``provenance`` block of a run's summary records it)."""

__version__ = "0.1.0"
