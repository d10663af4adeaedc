"""Run the real `orch8` command in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys


def orch8_env(**overrides: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH8_")}
    for key, value in overrides.items():
        if value is not None:
            env[key] = value
    return env


def run_orch8(*args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "orch8_py", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def assert_one_line_error(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    assert proc.returncode != 0, proc
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("orch8: error:")]
    assert len(errors) == 1, proc.stderr
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
