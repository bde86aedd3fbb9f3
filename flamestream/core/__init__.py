"""The FlameStream model, no I/O.  ``BUILD`` says whether its hot path runs compiled or as Python (``compiled``)."""

from flamestream.core.compiled import choose

BUILD = choose()
