"""`orch8 demo`: the engine's promise, shown on a few orders.

It starts a fake payment provider on loopback (``orch8_py.demo.provider``), stores a
``checkout`` sequence (validate, charge over ``http_request``, summary) in namespace
``demo`` of tenant ``default``, and runs a few orders with real ``orch8 run`` processes:

1. the last order runs first, alone, under a runner started with
   ``ORCH8_FAULT_POINT=before_finish``: the provider charges it and the runner is killed
   (SIGKILL) before it records the answer;
2. the other orders start and a normal runner runs them; once the crashed runner's
   (short) lease expires it takes the crashed order over, finds its receipt still
   ``dispatched``, marks it ``unknown`` and fails the order instead of charging again.

It then prints where to look (CLI, psql, console), how to ask the provider about the
charge, how to resolve the receipt and how to retry the order, and keeps the provider
up until Enter (``--no-wait`` skips that; ``--json`` prints a summary for scripts).

Wiring into the CLI::

    demo_p = sub.add_parser("demo", help="...")
    demo.add_arguments(demo_p)
    demo_p.set_defaults(func=demo.main)        # main(args, settings) -> int

Run as ``orch8 demo [--orders N] [--no-wait] [--json]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

from .. import config, db, sqlapi
from ..embedded import EmbeddedPostgres
from ..errors import ConfigError, Orch8Error
from ..sqlapi.base import Conn, Row
from ..startup import database, run_migrations
from .provider import FakeProvider

TENANT = "default"
NAMESPACE = "demo"
SEQUENCE = "checkout"
CURRENCY = "EUR"
FIRST_ORDER = 1001
AMOUNTS = (1250, 4200, 990, 3100, 575, 1999, 250, 8800)
MAX_ORDERS = 50
LEASE_SECONDS = 2  # short, so the normal runner takes the crashed order over quickly
HEARTBEAT_SECONDS = 0.5
CRASH_TIMEOUT = 60.0
FINISH_TIMEOUT = 90.0
TERMINAL = ("completed", "failed", "cancelled")

CHECKOUT: dict[str, Any] = {
    "blocks": [
        {
            "type": "step",
            "id": "validate",
            "handler": "assert",
            "params": {"condition": "data.amount > 0", "message": "amount must be positive"},
        },
        {
            "type": "step",
            "id": "charge",
            "handler": "http_request",
            # no idempotency_key: the effect id is sent as the Idempotency-Key header
            "params": {
                "method": "POST",
                "url": "{{ config.provider_url }}/v1/charges",
                "json": {
                    "amount": "{{ data.amount }}",
                    "currency": "{{ data.currency | 'EUR' }}",
                    "order_id": "{{ data.order_id }}",
                },
            },
            "retry": {"max_attempts": 3, "initial_backoff": 500},
        },
        {
            "type": "step",
            "id": "summary",
            "handler": "transform",
            "params": {
                "expression": "{order: data.order_id, amount: data.amount,"
                " paid: outputs.charge.receipt_id}"
            },
        },
    ],
    "invariants": [
        {"name": "charge once", "type": "effect_at_most_once", "kind": "http", "commit_guard": True}
    ],
}


class DemoFailed(Orch8Error):
    """The demo did not end the way it shows (one line, like every CLI error)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of `orch8 demo`."""
    p.add_argument(
        "--orders",
        type=int,
        default=3,
        metavar="N",
        help="how many orders to run, one of which crashes (default 3)",
    )
    p.add_argument(
        "--provider-port",
        type=int,
        default=0,
        metavar="PORT",
        help="port of the fake payment provider on 127.0.0.1 (default 0: a free port)",
    )
    p.add_argument(
        "--no-wait",
        action="store_true",
        help="exit at the end instead of keeping the fake provider up until Enter",
    )
    p.add_argument("--json", action="store_true", help="print a JSON summary instead of the guide")


@dataclass
class Order:
    order_id: int
    amount: int
    crash: bool = False
    instance_id: uuid.UUID | None = None
    state: str | None = None
    error: str | None = None
    effect_id: uuid.UUID | None = None
    receipt_state: str | None = None
    provider_receipt_id: str | None = None
    charges: list[str] = field(default_factory=list)  # the provider's charge ids

    @property
    def money(self) -> str:
        return f"{CURRENCY} {self.amount / 100:.2f}"

    def summary(self) -> dict[str, Any]:
        return {
            "order_id": self.order_id,
            "amount": self.amount,
            "currency": CURRENCY,
            "crashed": self.crash,
            "instance_id": str(self.instance_id) if self.instance_id else None,
            "state": self.state,
            "error": self.error,
            "effect_id": str(self.effect_id) if self.effect_id else None,
            "receipt_state": self.receipt_state,
            "provider_receipt_id": self.provider_receipt_id,
            "provider_charges": list(self.charges),
        }


def main(args: argparse.Namespace, settings: config.Settings) -> int:
    """`orch8 demo`. Raises Orch8Error (one line) for what a person must fix."""
    if not 1 <= args.orders <= MAX_ORDERS:
        raise ConfigError(f"--orders {args.orders}: give 1 to {MAX_ORDERS}")
    if not 0 <= args.provider_port < 65536:
        raise ConfigError(f"--provider-port {args.provider_port} is not a TCP port (0-65535)")
    return Demo(args, settings).run()


class Demo:
    def __init__(self, args: argparse.Namespace, settings: config.Settings):
        self.args = args
        self.settings = settings
        self.out: TextIO = sys.stderr if args.json else sys.stdout
        self.orders = [
            Order(FIRST_ORDER + i, AMOUNTS[i % len(AMOUNTS)]) for i in range(args.orders)
        ]
        self.orders[-1].crash = True
        self.logs = Path(tempfile.mkdtemp(prefix="orch8-demo-"))
        self.procs: list[subprocess.Popen[bytes]] = []
        self.sequence: dict[str, Any] = {}
        self.provider: FakeProvider | None = None
        self.url = ""
        self.unresolved_total = 0  # in the tenant, earlier runs' receipts included

    def say(self, msg: str) -> None:
        print(f"orch8 demo: {msg}", file=self.out, flush=True)

    # --- the run --------------------------------------------------------------------

    def run(self) -> int:
        ok = False
        try:
            with _database(self.settings, self.say) as url:
                self.url = url
                with contextlib.redirect_stdout(self.out):
                    run_migrations(url)
                with db.connect(url, autocommit=True) as conn:
                    _check_nothing_else_runs(conn)
                    port = self.args.provider_port
                    with FakeProvider(port, flag="--provider-port") as self.provider:
                        self.say(f"starting fake payment provider on {self.provider.url}")
                        self._store_sequence(conn)
                        self._crash_phase(conn)
                        self._normal_phase(conn)
                        self._check_outcome()
                        self._report()
                        ok = True
                        if not self.args.no_wait:
                            self._wait()
        finally:
            self._stop_runners()
            if ok or not any(self.logs.iterdir()):
                shutil.rmtree(self.logs, ignore_errors=True)
        return 0

    def _store_sequence(self, conn: Conn) -> None:
        row = sqlapi.sequences.find_sequence(
            conn, tenant_id=TENANT, namespace=NAMESPACE, name=SEQUENCE, definition=CHECKOUT
        )
        verb = "using"
        if row is None:
            row = sqlapi.sequences.create_sequence(
                conn, tenant_id=TENANT, namespace=NAMESPACE, name=SEQUENCE, definition=CHECKOUT
            )
            verb = "created"
        seq_id, version = row["id"], row["version"]
        self.sequence = {
            "tenant": TENANT,
            "namespace": NAMESPACE,
            "name": SEQUENCE,
            "version": version,
            "id": str(seq_id),
        }
        self.say(
            f"{verb} sequence {NAMESPACE}/{SEQUENCE} version {version}: validate -> charge "
            "(http_request, at most once) -> summary"
        )

    def _start(self, conn: Conn, order: Order) -> None:
        assert self.provider is not None
        order.instance_id = sqlapi.instances.create_instance(
            conn,
            tenant_id=TENANT,
            sequence_id=uuid.UUID(self.sequence["id"]),
            data={"order_id": order.order_id, "amount": order.amount, "currency": CURRENCY},
            config={"provider_url": self.provider.url},
        ).id

    def _crash_phase(self, conn: Conn) -> None:
        """Run the crash order alone under a runner that dies after the provider answers."""
        assert self.provider is not None
        order = self.orders[-1]
        self._start(conn, order)
        self.say(
            f"order {order.order_id} ({order.money}) started, instance {order.instance_id}; "
            "a runner that will be killed between charge and commit picks it up"
        )
        log = self.logs / "crashing-runner.log"
        proc = self._spawn(log, ORCH8_FAULT_POINT="before_finish")
        try:
            code = proc.wait(timeout=CRASH_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise DemoFailed(
                f"the crashing runner did not reach its fault point within {CRASH_TIMEOUT:g}s; "
                f"its log: {log}"
            ) from None
        if code != -signal.SIGKILL:
            raise DemoFailed(
                f"the crashing runner exited with code {code} instead of being killed at its "
                f"fault point: {_last_line(log)} (log: {log})"
            )
        row = _charge_receipt(conn, order)
        if row is None or row["state"] != "dispatched":
            raise DemoFailed(
                f"order {order.order_id}: expected its charge receipt in 'dispatched' after the "
                f"crash, found {row['state'] if row else 'no receipt'} (log: {log})"
            )
        order.effect_id = row["id"]
        charge = self.provider.charge_for_key(str(order.effect_id))
        seen = f"the provider charged it ({charge['id']})" if charge else "the provider was called"
        self.say(
            f"order {order.order_id}: runner crashed between charge and commit (on purpose): "
            f"{seen}, the engine never recorded the answer"
        )

    def _normal_phase(self, conn: Conn) -> None:
        """Start the other orders; a normal runner runs them and takes over the crashed one."""
        for order in self.orders[:-1]:
            self._start(conn, order)
        if len(self.orders) > 1:
            ids = ", ".join(str(o.order_id) for o in self.orders[:-1])
            self.say(f"order{'s' if len(self.orders) > 2 else ''} {ids} started")
        self.say(
            "a normal runner starts; it takes the crashed order over once the dead runner's "
            f"{LEASE_SECONDS}s lease expires"
        )
        log = self.logs / "runner.log"
        proc = self._spawn(log)
        by_id = {o.instance_id: o for o in self.orders if o.instance_id is not None}
        deadline = time.monotonic() + FINISH_TIMEOUT
        pending = set(by_id)
        while pending:
            rows = sqlapi.instances.instance_states(
                conn, tenant_id=TENANT, instance_ids=list(pending)
            )
            for found in rows:
                instance_id, state, error = found["id"], found["state"], found["error"]
                if state in TERMINAL:
                    order = by_id[instance_id]
                    order.state, order.error = state, error
                    pending.discard(instance_id)
                    self._load_receipt(conn, order)
                    self._announce(order)
            if not pending:
                break
            if proc.poll() is not None:
                raise DemoFailed(
                    f"the runner exited with code {proc.returncode} before the orders finished: "
                    f"{_last_line(log)} (log: {log})"
                )
            if time.monotonic() > deadline:
                left = ", ".join(str(by_id[i].order_id) for i in pending)
                raise DemoFailed(
                    f"order(s) {left} did not finish within {FINISH_TIMEOUT:g}s (log: {log})"
                )
            time.sleep(0.1)
        self._stop(proc)
        self.unresolved_total = sqlapi.effects.unresolved_summary(conn, tenant_id=TENANT)["depth"]

    def _load_receipt(self, conn: Conn, order: Order) -> None:
        assert self.provider is not None
        row = _charge_receipt(conn, order)
        if row is not None:
            order.effect_id = row["id"]
            order.receipt_state = row["state"]
            order.provider_receipt_id = row["provider_receipt_id"]
        order.charges = [c["id"] for c in self.provider.charges_for_order(order.order_id)]

    def _announce(self, order: Order) -> None:
        if order.state == "completed":
            self.say(
                f"order {order.order_id} completed: charged {order.money} once "
                f"({order.provider_receipt_id}), receipt {order.receipt_state}"
            )
        elif order.crash and order.receipt_state == "unknown":
            self.say(
                f"order {order.order_id} failed: its charge receipt {order.effect_id} is unknown "
                "(sent, outcome never recorded), so the engine will not charge it again"
            )
        else:
            self.say(f"order {order.order_id} {order.state}: {order.error}")

    def _check_outcome(self) -> None:
        problems = []
        for o in self.orders:
            if o.crash:
                if o.state != "failed" or o.receipt_state != "unknown":
                    problems.append(
                        f"order {o.order_id} should have failed with an unknown receipt "
                        f"but is {o.state} with receipt {o.receipt_state}"
                    )
            elif o.state != "completed" or o.receipt_state != "committed":
                problems.append(
                    f"order {o.order_id} is {o.state} with receipt {o.receipt_state}"
                    + (f" ({o.error})" if o.error else "")
                )
            if len(o.charges) != 1:
                problems.append(f"the provider charged order {o.order_id} {len(o.charges)} times")
        if problems:
            raise DemoFailed(
                f"the demo did not end as expected: {'; '.join(problems)} (logs in {self.logs})"
            )

    # --- the report -----------------------------------------------------------------

    def _report(self) -> None:
        if self.args.json:
            print(json.dumps(self.summary(), indent=2), flush=True)
        else:
            print(self.guide(), flush=True)

    def summary(self) -> dict[str, Any]:
        assert self.provider is not None
        crash = self.orders[-1]
        charges = self.provider.charge_for_key(str(crash.effect_id)) if crash.effect_id else None
        return {
            "database": db.describe(self.url),
            "provider_url": self.provider.url,
            "sequence": self.sequence,
            "orders": [o.summary() for o in self.orders],
            "unknown_effect": {
                "effect_id": str(crash.effect_id),
                "idempotency_key": str(crash.effect_id),
                "instance_id": str(crash.instance_id),
                "order_id": crash.order_id,
                "block_id": "charge",
                "state": crash.receipt_state,
                "provider_charge_id": charges["id"] if charges else None,
            },
            "provider": {
                "requests": self.provider.requests,
                "charges": len(self.provider.charges()),
            },
            "unresolved_effects_in_tenant": self.unresolved_total,
            "console_url": self._console_url(),
        }

    def _console_url(self) -> str:
        host = self.settings.host
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.settings.port}/console"

    def guide(self) -> str:
        assert self.provider is not None
        crash = self.orders[-1]
        done = [o for o in self.orders if not o.crash]
        effect = str(crash.effect_id)
        charge = self.provider.charge_for_key(effect)
        charge_id = charge["id"] if charge else "ch_..."
        evidence = '{"checked": "fake provider"}'
        psql = f"psql '{self.url}'"
        if self.settings.database_url:
            psql = 'psql "$ORCH8_DATABASE_URL"'
        lines = ["", "What happened"]
        if done:
            ids = ", ".join(str(o.order_id) for o in done)
            each = "Orders {}: charged once each" if len(done) > 1 else "Order {}: charged once"
            lines.append(f"  {each.format(ids)} and completed.")
        lines += [
            f"  Order {crash.order_id}: the provider charged it, but the runner was killed",
            "  before it wrote the answer down. The engine cannot tell whether the charge went",
            "  through, so its receipt is `unknown` and the order stopped instead of charging",
            "  again.",
            "",
            f"    instance         {crash.instance_id}  (failed)",
            f"    effect id        {effect}",
            f"    idempotency key  {effect}  (the effect id, sent as Idempotency-Key)",
            "    block            charge, attempt 0",
            "",
        ]
        if self.unresolved_total > 1:
            lines += [
                f"  (tenant {TENANT!r} holds {self.unresolved_total} unresolved receipts in all:",
                "  earlier runs left theirs too)",
                "",
            ]
        lines += [
            "1. See the unknown receipt",
            "     orch8 effects unresolved",
            f"     orch8 effects show {effect}",
            f"   or in psql ({psql}):",
            f"     {sqlapi.psql.unresolved_queue()}",
            f"   or in the console: {self._console_url()}",
            "     (in another terminal: ORCH8_ALLOW_PRIVATE_URLS=1 make run, or orch8 up;",
            "     the fake provider is on loopback, which http_request refuses by default)",
            "",
            "2. Ask the provider whether it received the charge (works while this demo runs)",
            f"     curl '{self.provider.url}/v1/charges?idempotency_key={effect}'",
            "",
            f"3. It did ({charge_id}): record the receipt as committed",
            f"     orch8 effects resolve {effect} --state committed \\",
            f"         --provider-receipt-id {charge_id} --evidence '{evidence}'",
            "   or in psql:",
            *(
                f"     {line}"
                for line in sqlapi.psql.resolve_effect(
                    TENANT, effect, "committed", charge_id, evidence
                )
            ),
            "",
            "4. Retry the order (the engine started by `make run` / `orch8 up` runs it)",
            f"     orch8 instances retry {crash.instance_id}",
            "",
        ]
        return "\n".join(lines)

    def _wait(self) -> None:
        assert self.provider is not None
        print(
            f"The fake provider stays up on {self.provider.url}; press Enter (or Ctrl-C) to stop "
            "it and end the demo.",
            file=self.out,
            flush=True,
        )
        with _sigterm_interrupts(), contextlib.suppress(EOFError, KeyboardInterrupt):
            input()

    # --- runner processes -----------------------------------------------------------

    def _spawn(self, log: Path, **extra: str) -> subprocess.Popen[bytes]:
        """`orch8 run` on the demo's database, with a short lease and private URLs allowed."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH8_")}
        env.update(
            ORCH8_DATABASE_URL=self.url,
            ORCH8_ALLOW_PRIVATE_URLS="1",  # the fake provider is on loopback
            ORCH8_LEASE_SECONDS=str(LEASE_SECONDS),
            ORCH8_HEARTBEAT_SECONDS=str(HEARTBEAT_SECONDS),
            ORCH8_TICK_INTERVAL="0.05",
            ORCH8_GRACE_SECONDS="5",
            **extra,
        )
        package_root = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "orch8_py", "run"],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.procs.append(proc)
        return proc

    @staticmethod
    def _stop(proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

    def _stop_runners(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                self._stop(proc)


# --- helpers ----------------------------------------------------------------------------


@contextlib.contextmanager
def _database(settings: config.Settings, say: Callable[[str], None]) -> Iterator[str]:
    """The CLI's database: ORCH8_DATABASE_URL, else the embedded server. Unlike
    ``cli.database``, an embedded server this demo started is left running when other
    clients (an `orch8 up` started meanwhile for the console) are connected to it."""
    if settings.database_url:
        with database(settings, quiet=True) as url:
            yield url
        return
    server = EmbeddedPostgres(settings.data_dir)
    url = server.start()
    verb = "started" if server.started_here else "reusing running"
    say(f"{verb} embedded PostgreSQL, data in {server.pgdata}")
    try:
        yield url
    finally:
        if server.started_here:
            others = _other_clients(url)
            if others:
                say(f"leaving the embedded PostgreSQL running: {others} other client(s) use it")
            else:
                server.stop()


def _other_clients(url: str, settle: float = 2.0) -> int:
    """Client sessions other than ours; waits up to ``settle`` seconds for the ones that are
    just closing (our runners, our own connection) to leave."""
    deadline = time.monotonic() + settle
    try:
        with db.connect(url, autocommit=True) as conn:
            while True:
                count = sqlapi.server.other_client_sessions(conn)
                if count == 0 or time.monotonic() > deadline:
                    return count
                time.sleep(0.2)
    except Exception:  # the server is going away anyway: stop it
        return 0


def _charge_receipt(conn: Conn, order: Order) -> Row | None:
    """The latest receipt of the order's charge step."""
    assert order.instance_id is not None
    receipts = sqlapi.effects.receipts_of_instance(
        conn, tenant_id=TENANT, instance_id=order.instance_id
    )
    charges = [r for r in receipts if r["block_id"] == "charge"]
    return charges[-1] if charges else None


def _check_nothing_else_runs(conn: Conn) -> None:
    """Refuse when another runner or other due work would mix with the demo's crash."""
    if sqlapi.server.runners_listening(conn):
        raise ConfigError(
            "an orch8 runner is already connected to this database (`orch8 up`, `make run` or "
            "`orch8 run`): stop it before the demo, or it would run the demo's orders itself; "
            "start it again afterwards"
        )
    waiting = sqlapi.observe.instances_in_flight(conn)
    if waiting:
        raise ConfigError(
            f"{waiting} instance(s) in this database are scheduled or running, and the demo's "
            "runners would pick them up: let `orch8 up` finish them first, or point "
            "ORCH8_DATABASE_URL at another database"
        )


def _last_line(log: Path) -> str:
    try:
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "(no log)"
    return lines[-1][-300:] if lines else "(empty log)"


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """While waiting for Enter, SIGTERM ends the wait like Ctrl-C (cleanup still runs)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
