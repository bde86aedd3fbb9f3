"""Exceptions of compiled core modules whose base is a built-in error other than ``Exception``.

Why a module of their own: mypyc compiles a class deriving from ``TypeError`` or ``ValueError`` only as a
non-native class, which needs a decorator from ``mypy_extensions`` (a dependency the core does not have), so these
stay interpreted here and the modules that raise them (``hashing``, ``payload``) compile.  Import them from those
modules, which re-export them.
"""

from __future__ import annotations


class BalanceError(TypeError):
    """A balancing function returned something that is not an integer: that item's failure (its dead letter, or
    its rejection at the front), like an exception raised by the function."""


class PayloadError(ValueError):
    """A client payload is not a JSON value, or not one the workers can process and write."""
