"""The console's one blueprint, apart from the modules that register on it (no import cycles)."""

from __future__ import annotations

import logging
from pathlib import Path

from flask import Blueprint

# One logger for the whole console, so its events keep one name whichever module logs them.
log = logging.getLogger("orch8.web.console")

bp = Blueprint(
    "console",
    __name__,
    url_prefix="/console",
    # A relative folder would resolve against this package; the files live in web/static.
    static_folder=Path(__file__).resolve().parent.parent / "static",
    static_url_path="/static",
)
