"""The one place the version is written; setup.cfg reads it from here."""

__version__ = "0.11.0"
