"""Every example of docs/WORKFLOWS.md runs as printed: each ```json block after an
``<!-- example ... -->`` line is stored, started with the data the line gives, run on a
real runner, and must end as the line says (its state, and the output of a block, a
skipped block or the start of the error when given)."""

from __future__ import annotations

import importlib
import json
import re
import shlex
import time
from pathlib import Path

import pytest

from orch8_py import sqlapi
from tests.runner_helpers import TENANT, running, start, wait_for

DOC = Path(__file__).parent.parent / "docs" / "WORKFLOWS.md"
EXAMPLE = re.compile(r"<!-- example (.*?) -->\n```json\n(.*?)\n```", re.DOTALL)


def examples() -> list[tuple[dict[str, str], str]]:
    found = []
    for attrs, body in EXAMPLE.findall(DOC.read_text(encoding="utf-8")):
        fields = dict(part.split("=", 1) for part in shlex.split(attrs))
        found.append((fields, body))
    return found


def test_the_guide_has_an_example_per_block():
    names = {fields["name"] for fields, _ in examples()}
    assert names >= {
        "when", "parallel", "race", "loop", "for_each", "router", "try_catch", "saga",
        "sub_sequence", "on_failure", "sleep", "delay", "wait_for_signal", "wait_for_input",
        "concurrency_key", "definition_concurrency_key", "rate_limit",
    }  # fmt: skip


@pytest.mark.parametrize(("fields", "body"), examples(), ids=[f["name"] for f, _ in examples()])
def test_each_example_runs_as_printed(db_url, conn, fields, body):
    if "import" in fields:
        importlib.import_module(fields["import"])
    if "child" in fields:
        child = json.loads(fields["child"])
        sqlapi.sequences.create_sequence(
            conn,
            tenant_id=TENANT,
            namespace="default",
            name=child["name"],
            definition=child["definition"],
        )
    stored = sqlapi.sequences.create_sequence(
        conn,
        tenant_id=TENANT,
        namespace="default",
        name=f"example-{fields['name']}",
        definition=json.loads(body),
    )
    if "rate_limit" in fields:  # the tenant's bucket the example's steps name
        limit = json.loads(fields["rate_limit"])
        sqlapi.flow_control.set_rate_limit(
            conn, tenant_id=TENANT, key=limit["key"], rate=limit["rate"], per=limit["per"]
        )
    if "started_ago" in fields:  # the engine clock of the start: its timers are due now
        conn.execute(
            "SELECT set_config('orch8.fake_now', (now() - %s::interval)::text, false)",
            (fields["started_ago"],),
        )
    instance = start(conn, stored["id"], json.loads(fields.get("data", "{}")))
    conn.execute("RESET orch8.fake_now")
    with running(db_url):
        if "signal" in fields:
            signal = json.loads(fields["signal"])
            sqlapi.instances.send_signal(
                conn,
                tenant_id=TENANT,
                instance_id=instance,
                signal_type=signal["type"],
                payload=signal.get("payload", {}),
                actor="the guide",
            )
        if "answer" in fields:
            answer = json.loads(fields["answer"])
            wait_for(conn, [instance], ("waiting",))
            for _ in range(200):  # the runner renders the prompt, then the node waits
                if sqlapi.instances.waiting_nodes(
                    conn, tenant_id=TENANT, instance_id=instance, waiting_for="input"
                ):
                    break
                time.sleep(0.05)
            sqlapi.instances.answer_input(
                conn,
                tenant_id=TENANT,
                instance_id=instance,
                path=answer["path"],
                choice=answer["choice"],
                comment=answer.get("comment"),
                actor="the guide",
            )
        state, error = wait_for(conn, [instance], ("completed", "failed", "cancelled"))[instance]
    assert state == fields["state"], error
    if "error_starts" in fields:
        assert error.startswith(fields["error_starts"]), error
    if "output" in fields:
        got = conn.execute(
            "SELECT output FROM orch8.block_outputs WHERE instance_id = %s AND block_id = %s"
            " AND sentinel IS NULL ORDER BY seq DESC LIMIT 1",
            (instance, fields["output"]),
        ).fetchone()
        assert got is not None and got[0] == json.loads(fields["equals"]), got
    if "skipped" in fields:
        node = conn.execute(
            "SELECT state::text FROM orch8.execution_nodes WHERE instance_id = %s AND path = %s",
            (instance, fields["skipped"]),
        ).fetchone()
        assert node == ("skipped",)
