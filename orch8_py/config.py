"""Settings read from the environment (each can also be given as a CLI flag)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from .errors import ConfigError

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
# Instances one runner works on at once: enough that group commit fills its batches. One
# waiting for the database costs a suspended generator, not a thread (docs/ARCHITECTURE.md,
# "An instance waits without a thread"); 128 was the fastest of 32-512 in
# docs/PERFORMANCE.md.
DEFAULT_CONCURRENCY = 128


@dataclass(frozen=True)
class Settings:
    database_url: str | None
    # Least-privilege logins (docs/SECURITY.md): when set, the runner connects as
    # orch8_runner and the operator service as orch8_web through these instead.
    runner_database_url: str | None
    web_database_url: str | None
    data_dir: Path
    host: str
    port: int
    tick_interval: float
    concurrency: int
    lease: float
    heartbeat: float
    grace: float
    verify_interval: float
    group_commit: bool

    @property
    def embedded(self) -> bool:
        return self.database_url is None


N = TypeVar("N", int, float)


def default_data_dir() -> Path:
    import platformdirs

    return Path(platformdirs.user_data_dir("orch8", appauthor=False))


def _number(name: str, default: N, cast: Callable[[str], N]) -> N:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = cast(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number") from None
    if value <= 0:
        raise ConfigError(f"{name}={raw!r} must be greater than zero")
    return value


def _switch(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    if raw.lower() in ("1", "on", "true", "yes"):
        return True
    if raw.lower() in ("0", "off", "false", "no"):
        return False
    raise ConfigError(f"{name}={raw!r} must be on or off (1/0, true/false)")


def load() -> Settings:
    url = os.environ.get("ORCH8_DATABASE_URL") or None
    data_dir = os.environ.get("ORCH8_DATA_DIR")
    port = _number("ORCH8_PORT", DEFAULT_PORT, int)
    if port > 65535:
        raise ConfigError(f"ORCH8_PORT={port} is not a TCP port (1-65535)")
    settings = Settings(
        database_url=url,
        runner_database_url=os.environ.get("ORCH8_RUNNER_DATABASE_URL") or None,
        web_database_url=os.environ.get("ORCH8_WEB_DATABASE_URL") or None,
        data_dir=Path(data_dir).expanduser() if data_dir else default_data_dir(),
        host=os.environ.get("ORCH8_HOST") or DEFAULT_HOST,
        port=port,
        tick_interval=_number("ORCH8_TICK_INTERVAL", 0.1, float),
        concurrency=_number("ORCH8_CONCURRENCY", DEFAULT_CONCURRENCY, int),
        lease=_number("ORCH8_LEASE_SECONDS", 30.0, float),
        heartbeat=_number("ORCH8_HEARTBEAT_SECONDS", 10.0, float),
        grace=_number("ORCH8_GRACE_SECONDS", 30.0, float),
        verify_interval=_number("ORCH8_VERIFY_INTERVAL", 0.5, float),
        group_commit=_switch("ORCH8_GROUP_COMMIT", True),
    )
    from .db import validate_url  # db imports nothing of ours but errors; keep config light

    for source, role_url in (
        ("ORCH8_RUNNER_DATABASE_URL", settings.runner_database_url),
        ("ORCH8_WEB_DATABASE_URL", settings.web_database_url),
    ):
        if role_url:
            validate_url(role_url, source)
    if settings.heartbeat >= settings.lease:
        raise ConfigError(
            f"ORCH8_HEARTBEAT_SECONDS ({settings.heartbeat:g}) must be shorter than "
            f"ORCH8_LEASE_SECONDS ({settings.lease:g}), or leases expire between heartbeats"
        )
    return settings
