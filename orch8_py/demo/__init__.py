"""`orch8 demo`: the engine's promise, shown on a few orders.

It starts a fake payment provider on loopback (``orch8_py.demo.provider``, which keeps one
charge per idempotency key and can be asked for the charge of a key), stores a
``checkout`` sequence (validate, charge over ``http_request`` with a verifier, summary)
in namespace ``demo`` of tenant ``default``, and runs a few orders with real ``orch8
run`` processes:

1. the first order's charge is answered late: the provider charges it and answers after
   the step's timeout. The receipt is ``unknown``; the engine does not charge again, and
   the step's verifier asks the provider for the charge of the receipt's key, finds it,
   records the receipt ``verified`` and the order continues with the provider's answer;
   the other orders (but the last) are charged and complete;
2. the last order runs alone under a runner started with
   ``ORCH8_FAULT_POINT=before_finish``: the provider charges it and the runner is killed
   (SIGKILL) before it records the answer;
3. the provider's lookup API goes down (simulated) and a normal runner takes the crashed
   order over once its lease expires: the receipt is ``unknown``, the verifier cannot
   tell, escalates it after its last try, and the order fails instead of charging again.

It then prints where to look (CLI, psql, console), how to ask the provider about the
charge, how to record it (the step's output derived from the provider's answer) and how
to retry the order, and keeps the provider up until Enter (``--no-wait`` skips that;
``--json`` prints a summary for scripts).

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
from ..handlers.http import output_from_response
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
CHARGE_TIMEOUT_MS = 1000  # the charge step waits this long for the provider's answer
SLOW_ANSWER = 3.0  # seconds the provider takes to answer the late order (past the timeout)
VERIFY_SCHEDULE = [500, 1000, 1500]  # ms before each of the verifier's tries
CRASH_TIMEOUT = 60.0
FINISH_TIMEOUT = 90.0
TERMINAL = ("completed", "failed", "cancelled")
RECEIPT_PATH = "json.id"  # where a charge answer holds the provider's receipt id

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
            # no idempotency_key: the receipt's id is sent as the Idempotency-Key header
            "params": {
                "method": "POST",
                "url": "{{ config.provider_url }}/v1/charges",
                "json": {
                    "amount": "{{ data.amount }}",
                    "currency": "{{ data.currency | 'EUR' }}",
                    "order_id": "{{ data.order_id }}",
                },
                "timeout_ms": CHARGE_TIMEOUT_MS,
                "receipt_path": RECEIPT_PATH,
            },
            "retry": {"max_attempts": 3, "initial_backoff": 500},
            # an unknown outcome: ask the provider for the charge of the receipt's key
            "verify": {
                "http": {
                    "url": "{{ config.provider_url }}/v1/charges"
                    "?idempotency_key={{ effect.idempotency_key }}"
                },
                "applied_if": "response.status == 200",
                "not_applied_if": "response.status == 404",
                "receipt_path": RECEIPT_PATH,
                "schedule": VERIFY_SCHEDULE,
            },
        },
        {
            "type": "step",
            "id": "summary",
            "handler": "transform",
            "params": {
                "expression": "{order: data.order_id, amount: data.amount,"
                " paid: outputs.charge.json.id}"
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
        help="how many orders to run: the first is answered late, the last crashes (default 3)",
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
    late: bool = False  # the provider answers its charge after the step's timeout
    instance_id: uuid.UUID | None = None
    state: str | None = None
    error: str | None = None
    effect_id: uuid.UUID | None = None
    receipt_state: str | None = None
    provider_receipt_id: str | None = None
    settled_by: str | None = None  # who settled an unknown receipt (verifier:http)
    verification: str | None = None  # the verifier's state (settled, escalated)
    announced_unknown: bool = False
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
            "answered_late": self.late,
            "instance_id": str(self.instance_id) if self.instance_id else None,
            "state": self.state,
            "error": self.error,
            "effect_id": str(self.effect_id) if self.effect_id else None,
            "receipt_state": self.receipt_state,
            "provider_receipt_id": self.provider_receipt_id,
            "settled_by": self.settled_by,
            "verification": self.verification,
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
        if len(self.orders) > 1:
            self.orders[0].late = True
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
                        self._verify_phase(conn)
                        self._crash_phase(conn)
                        self._escalation_phase(conn)
                        self._check_outcome()
                        self.unresolved_total = sqlapi.effects.unresolved_summary(
                            conn, tenant_id=TENANT
                        )["depth"]
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
            f"(http_request, at most once, {CHARGE_TIMEOUT_MS / 1000:g}s timeout, a verifier "
            "that asks the provider) -> summary"
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

    def _verify_phase(self, conn: Conn) -> None:
        """Every order but the last, under a normal runner; the first is answered late."""
        assert self.provider is not None
        orders = self.orders[:-1]
        if not orders:
            return
        late = orders[0]
        self.provider.fail_next("slow", delay=SLOW_ANSWER, order_id=late.order_id)
        for order in orders:
            self._start(conn, order)
        ids = ", ".join(str(o.order_id) for o in orders)
        self.say(
            f"order{'s' if len(orders) > 1 else ''} {ids} started; the provider will charge "
            f"order {late.order_id} but answer only after {SLOW_ANSWER:g}s, past the step's "
            f"{CHARGE_TIMEOUT_MS / 1000:g}s timeout"
        )
        self._run_until_done(conn, orders, "runner.log")

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

    def _escalation_phase(self, conn: Conn) -> None:
        """The lookup API down, a normal runner takes the crashed order over."""
        assert self.provider is not None
        order = self.orders[-1]
        self.provider.lookup_down = True
        self.say(
            "the provider's lookup API goes down (simulated): a verifier asking about a charge "
            "gets 503"
        )
        self.say(
            "a normal runner starts; it takes the crashed order over once the dead runner's "
            f"{LEASE_SECONDS}s lease expires"
        )
        self._run_until_done(conn, [order], "takeover-runner.log")
        self.provider.lookup_down = False
        self.say("the provider's lookup API is back")

    def _run_until_done(self, conn: Conn, orders: list[Order], log_name: str) -> None:
        """A normal runner until ``orders`` end, announcing what happens to each."""
        log = self.logs / log_name
        proc = self._spawn(log)
        by_id = {o.instance_id: o for o in orders if o.instance_id is not None}
        deadline = time.monotonic() + FINISH_TIMEOUT
        pending = set(by_id)
        while pending:
            for found in sqlapi.instances.instance_states(
                conn, tenant_id=TENANT, instance_ids=list(pending)
            ):
                order = by_id[found["id"]]
                if found["state"] == "waiting" and not order.announced_unknown:
                    order.announced_unknown = True
                    self._load_receipt(conn, order)
                    self._announce_unknown(order)
                if found["state"] in TERMINAL:
                    order.state, order.error = found["state"], found["error"]
                    pending.discard(found["id"])
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

    def _load_receipt(self, conn: Conn, order: Order) -> None:
        assert self.provider is not None
        row = _charge_receipt(conn, order)
        if row is not None:
            order.effect_id = row["id"]
            order.receipt_state = row["state"]
            order.provider_receipt_id = row["provider_receipt_id"]
            resolution = (row["evidence"] or {}).get("resolution") or {}
            order.settled_by = resolution.get("actor")
            verifying = sqlapi.effects.verification(conn, tenant_id=TENANT, effect_id=row["id"])
            order.verification = verifying["state"] if verifying else None
        order.charges = [c["id"] for c in self.provider.charges_for_order(order.order_id)]

    def _announce_unknown(self, order: Order) -> None:
        why = (
            f"the provider answered after the step's {CHARGE_TIMEOUT_MS / 1000:g}s timeout"
            if order.late
            else "the dead runner's lease expired with its charge in flight"
        )
        self.say(
            f"order {order.order_id}: {why}: receipt {order.effect_id} is unknown; the engine "
            "does not charge again, the step's verifier asks the provider "
            "(GET /v1/charges?idempotency_key=<the receipt's key>)"
        )

    def _announce(self, order: Order) -> None:
        if order.state == "completed" and order.receipt_state == "verified":
            self.say(
                f"order {order.order_id} completed: its verifier found the charge "
                f"({order.provider_receipt_id}), recorded the receipt verified, and the order "
                "went on with the provider's answer"
            )
        elif order.state == "completed":
            self.say(
                f"order {order.order_id} completed: charged {order.money} once "
                f"({order.provider_receipt_id}), receipt {order.receipt_state}"
            )
        elif order.crash and order.receipt_state == "unknown":
            self.say(
                f"order {order.order_id} failed: the verifier could not tell (lookups answered "
                f"503) and after its {len(VERIFY_SCHEDULE)} tries escalated receipt "
                f"{order.effect_id} to you; the engine will not charge it again"
            )
        else:
            self.say(f"order {order.order_id} {order.state}: {order.error}")

    def _check_outcome(self) -> None:
        problems = []
        for o in self.orders:
            found: tuple[str | None, ...] = (o.state, o.receipt_state, o.verification)
            expected: tuple[str | None, ...] = ("completed", "committed", None)
            if o.crash:
                expected = ("failed", "unknown", "escalated")
            elif o.late:
                expected = ("completed", "verified", "settled")
            if found != expected:
                problems.append(
                    f"order {o.order_id} should be {'/'.join(str(x) for x in expected)} but is "
                    f"{'/'.join(str(f) for f in found)}" + (f" ({o.error})" if o.error else "")
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
        charge = self.provider.charge_for_key(str(crash.effect_id)) if crash.effect_id else None
        late = self.orders[0] if self.orders[0].late else None
        return {
            "database": db.describe(self.url),
            "provider_url": self.provider.url,
            "sequence": self.sequence,
            "orders": [o.summary() for o in self.orders],
            "verified_effect": (
                {
                    "effect_id": str(late.effect_id),
                    "order_id": late.order_id,
                    "state": late.receipt_state,
                    "settled_by": late.settled_by,
                    "provider_receipt_id": late.provider_receipt_id,
                }
                if late
                else None
            ),
            "unknown_effect": {
                "effect_id": str(crash.effect_id),
                "idempotency_key": str(crash.effect_id),
                "instance_id": str(crash.instance_id),
                "order_id": crash.order_id,
                "block_id": "charge",
                "state": crash.receipt_state,
                "verification": crash.verification,
                "provider_charge_id": charge["id"] if charge else None,
            },
            "provider": {
                "requests": self.provider.requests,
                "charges": len(self.provider.charges()),
                "lookups": self.provider.lookups,
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
        late = self.orders[0] if self.orders[0].late else None
        done = [o for o in self.orders if not o.crash and not o.late]
        effect = str(crash.effect_id)
        charge = self.provider.charge_for_key(effect)
        charge_id = charge["id"] if charge else "ch_..."
        lookup_url = f"{self.provider.url}/v1/charges?idempotency_key={effect}"
        evidence = json.dumps({"checked": f"GET /v1/charges?idempotency_key={effect}"})
        response = json.dumps({"status": 200, "json": charge}, separators=(", ", ": "))
        output = json.dumps(
            output_from_response({"status": 200, "json": charge}, RECEIPT_PATH),
            separators=(",", ":"),
        )
        psql = f"psql '{self.url}'"
        if self.settings.database_url:
            psql = 'psql "$ORCH8_DATABASE_URL"'
        lines = ["", "What happened"]
        if done:
            ids = ", ".join(str(o.order_id) for o in done)
            each = "Orders {}: charged once each" if len(done) > 1 else "Order {}: charged once"
            lines.append(f"  {each.format(ids)} and completed.")
        if late:
            lines += [
                f"  Order {late.order_id}: the provider charged it but answered after the step's",
                "  timeout. The engine did not charge again: the step's verifier asked the",
                "  provider for the charge of the receipt's key, found it",
                f"  ({late.provider_receipt_id}), recorded the receipt as verified, and the",
                "  order went on with that answer.",
                f"    orch8 effects show {late.effect_id}",
            ]
        lines += [
            f"  Order {crash.order_id}: the provider charged it, but the runner was killed",
            "  before it wrote the answer down, and while the provider's lookup API was down",
            "  the verifier could not tell either: after its last try it escalated the receipt",
            "  to you. The order stopped instead of charging again; the receipt is `unknown`.",
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
            "1. See the escalated receipt",
            "     orch8 effects unresolved",
            f"     orch8 effects show {effect}",
            f"   or in psql ({psql}):",
            f"     {sqlapi.psql.unresolved_queue()}",
            f"   or in the console: {self._console_url()}",
            "     (in another terminal: ORCH8_ALLOW_PRIVATE_URLS=1 make run, or orch8 up;",
            "     the fake provider is on loopback, which http_request refuses by default)",
            "",
            "2. Ask the provider whether it received the charge (works while this demo runs;",
            "   the lookup API is back)",
            f"     curl '{lookup_url}'",
            "",
            f"3. It did ({charge_id}): record the receipt as committed, with the provider's",
            "   answer; the charge step's output is derived from it as http_request would",
            "   have returned it, so the summary step can read the charge id",
            f"     orch8 effects resolve {effect} --expected-state unknown --state committed \\",
            f"         --provider-receipt-id {charge_id} \\",
            f"         --evidence '{evidence}' \\",
            f"         --response '{response}'",
            "   or in psql (the output given as it would be derived):",
            *(
                f"     {line}"
                for line in sqlapi.psql.resolve_effect(
                    TENANT, effect, "unknown", "committed", charge_id, evidence, output
                )
            ),
            "",
            "4. Retry the order: the charge step completes from that evidence without charging",
            "   again, and the summary runs (the engine started by `make run` / `orch8 up`",
            "   runs it)",
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
