"""The package version, in a module of its own so that any layer can record it (saved models, tuning logs)
without importing the package's top level."""

__version__ = "0.1.0"
