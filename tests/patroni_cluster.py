"""A real Patroni cluster on loopback for the failover tests: one etcd, three PostgreSQL 15
nodes each run by its own Patroni, built from the Debian packages `patroni` and
`etcd-server` (`.ci/run` installs them).

Replication between the nodes goes through a `Relay` in this process, one per node: a TCP
forwarder in front of the node's port, advertised to Patroni as the node's address. The
relay can `hold` the stream from the primary (the standbys stop receiving WAL while
clients still commit: an asynchronous standby lagging behind) and `cut` it (the bytes it
held are dropped, as a dead primary's unsent WAL is). Clients reach the nodes directly.

Everything runs as the `postgres` system user (PostgreSQL refuses to run as root) in a
directory under /tmp that this user can reach.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

PATRONI = "/usr/bin/patroni"
ETCD = "/usr/bin/etcd"
PG_BIN = "/usr/lib/postgresql/15/bin"
SYSTEM_USER = "postgres"


def missing() -> str | None:
    """Why the cluster cannot be built here, or None."""
    for path, package in (
        (PATRONI, "patroni"),
        (ETCD, "etcd-server"),
        (f"{PG_BIN}/postgres", "postgresql-15"),
    ):
        if not os.path.exists(path):
            return f"{path} is missing (Debian package {package})"
    try:
        pwd.getpwnam(SYSTEM_USER)
    except KeyError:
        return f"no system user {SYSTEM_USER!r} to run PostgreSQL as"
    if os.geteuid() != 0:
        return "the cluster test starts its servers as the postgres user and needs root"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(check: Callable[[], Any], timeout: float, what: str, every: float = 0.1) -> Any:
    """Poll ``check`` until it returns something truthy; its errors count as not yet."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = check()
            if value:
                return value
        except Exception as exc:  # not up yet
            last = exc
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what} (last error: {last})")


def _children(pid: int) -> list[int]:
    found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in found.split()]


class Relay:
    """A TCP forwarder 127.0.0.1:port -> 127.0.0.1:target for replication connections."""

    def __init__(self, target: int):
        self.target = target
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._server.getsockname()[1])
        self._flowing = threading.Event()
        self._flowing.set()
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def hold(self) -> None:
        """Stop passing on what the node sends (its WAL, when it is the primary)."""
        self._flowing.clear()

    def cut(self) -> None:
        """Close every connection, dropping what was held, and let new ones flow."""
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            for s in pair:
                with contextlib.suppress(OSError):
                    s.close()
        self._flowing.set()

    def close(self) -> None:
        self._closed = True
        self.cut()
        with contextlib.suppress(OSError):
            self._server.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target), timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._pairs.append((client, upstream))
            threading.Thread(target=self._pipe, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, True), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, from_node: bool) -> None:
        try:
            while True:
                if from_node:
                    self._flowing.wait()
                data = source.recv(65536)
                if not data:
                    break
                if from_node and not self._flowing.is_set():
                    # held while this recv was waiting: keep it back until released or cut
                    self._flowing.wait()
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)


class Node:
    def __init__(self, cluster: Cluster, name: str):
        self.cluster = cluster
        self.name = name
        self.dir = cluster.root / name
        self.data = self.dir / "data"
        self.port = free_port()
        self.rest_port = free_port()
        self.relay = Relay(self.port)
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = self.dir / "patroni.log"

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def config(self) -> dict[str, Any]:
        c = self.cluster
        return {
            "scope": c.scope,
            "name": self.name,
            "log": {"level": "INFO"},
            "restapi": {
                "listen": f"127.0.0.1:{self.rest_port}",
                "connect_address": f"127.0.0.1:{self.rest_port}",
            },
            "etcd3": {"hosts": [f"127.0.0.1:{c.etcd_port}"]},
            "bootstrap": {
                "dcs": {
                    "ttl": c.ttl,
                    "loop_wait": c.loop_wait,
                    "retry_timeout": c.loop_wait * 2,
                    "maximum_lag_on_failover": 16 * 1024 * 1024,
                    "synchronous_mode": c.synchronous,
                    "postgresql": {
                        "use_pg_rewind": True,
                        "use_slots": True,
                        "parameters": {
                            "wal_log_hints": "on",
                            "wal_keep_size": "256MB",
                            "max_wal_senders": 10,
                            "max_replication_slots": 10,
                            "synchronous_commit": "on",
                        },
                    },
                },
                "initdb": [{"encoding": "UTF8"}, {"locale": "C"}, {"auth": "trust"}],
                "pg_hba": [
                    "local all all trust",
                    "host all all 127.0.0.1/32 trust",
                    "host replication all 127.0.0.1/32 trust",
                ],
            },
            "postgresql": {
                "listen": f"127.0.0.1:{self.port}",
                # what the other nodes (and Patroni's leader checks) dial: the relay
                "connect_address": f"127.0.0.1:{self.relay.port}",
                "data_dir": str(self.data),
                "bin_dir": PG_BIN,
                "pgpass": str(self.dir / "pgpass"),
                "authentication": {
                    "superuser": {"username": "postgres", "password": "postgres"},
                    "replication": {"username": "postgres", "password": "postgres"},
                    "rewind": {"username": "postgres", "password": "postgres"},
                },
                "parameters": {
                    "unix_socket_directories": str(self.dir),
                    "fsync": "off",  # a test cluster: speed over surviving the host's crash
                    "full_page_writes": "on",
                },
                "remove_data_directory_on_rewind_failure": True,
                "remove_data_directory_on_diverged_timelines": True,
            },
        }

    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        cfg = self.dir / "patroni.yml"
        cfg.write_text(json.dumps(self.config(), indent=1))  # JSON is YAML
        self.cluster.chown(self.dir)
        log = open(self.log, "ab")  # noqa: SIM115 (closed by the process's exit)
        self.proc = subprocess.Popen(
            [PATRONI, str(cfg)],
            user=SYSTEM_USER,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
        )

    def postmaster_pid(self) -> int | None:
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def kill(self) -> None:
        """SIGKILL this node's Patroni and its postmaster at once (a lost machine)."""
        pid = self.postmaster_pid()
        # backends outlive a killed postmaster until they notice: take them down with it
        children = _children(pid) if pid is not None else []
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for victim in [pid, *children] if pid is not None else []:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)
        self.relay.cut()

    def rest(self, path: str) -> Any:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.rest_port}{path}", timeout=2) as r:
            return json.loads(r.read())


class Cluster:
    def __init__(self, synchronous: bool, ttl: int = 10, loop_wait: int = 2, size: int = 3):
        self.synchronous = synchronous
        self.ttl = ttl
        self.loop_wait = loop_wait
        self.scope = f"orch8ha{os.getpid()}"
        self.root = Path(tempfile.mkdtemp(prefix="orch8-ha-", dir="/tmp"))
        os.chmod(self.root, 0o755)
        self.etcd_port = free_port()
        self.etcd_peer_port = free_port()
        self.etcd: subprocess.Popen[bytes] | None = None
        self.nodes = [Node(self, f"node{i + 1}") for i in range(size)]

    def chown(self, path: Path) -> None:
        for p in [path, *path.rglob("*")]:
            shutil.chown(p, SYSTEM_USER, SYSTEM_USER)

    def url(self, dbname: str = "orch8") -> str:
        hosts = ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)
        return f"postgresql://postgres@{hosts}/{dbname}?target_session_attrs=read-write"

    def start(self) -> Cluster:
        etcd_dir = self.root / "etcd"
        etcd_dir.mkdir()
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"
        client = f"http://127.0.0.1:{self.etcd_port}"
        log = open(self.root / "etcd.log", "ab")  # noqa: SIM115 (closed by the process's exit)
        command = [ETCD, "--name", "e1", "--data-dir", str(etcd_dir), "--unsafe-no-fsync"]
        command += ["--listen-client-urls", client, "--advertise-client-urls", client]
        command += ["--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer]
        command += ["--initial-cluster", f"e1={peer}"]
        self.etcd = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_until(
            lambda: urllib.request.urlopen(f"{client}/health", timeout=1).status == 200,
            30,
            "etcd to answer",
        )
        for node in self.nodes:  # one wins the race to initialize, the others copy it
            node.start()
        self.wait_healthy()
        return self

    def members(self) -> list[dict[str, Any]]:
        for node in self.nodes:
            with contextlib.suppress(Exception):
                return list(node.rest("/cluster")["members"])
        raise AssertionError("no Patroni REST API answers")

    def leader(self) -> Node | None:
        for m in self.members():
            if m["role"] == "leader" and m["state"] == "running":
                return self.node(m["name"])
        return None

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    def wait_healthy(self, timeout: float = 120) -> Node:
        """Until a leader runs and every other node streams from it (one of them as the
        synchronous standby in synchronous mode). Returns the leader."""

        def healthy() -> Node | None:
            leader = self.leader()
            if leader is None:
                return None
            replication = leader.rest("/patroni").get("replication", [])
            streaming = [r for r in replication if r.get("state") == "streaming"]
            if len(streaming) < len(self.nodes) - 1:
                return None
            if self.synchronous:
                # Patroni lets only the standby its /sync key names be promoted, and it
                # names one a loop after pg_stat_replication first shows it as sync
                roles = [m["role"] for m in self.members() if m["state"] == "running"]
                if "sync_standby" not in roles:
                    return None
            return leader

        found: Node = wait_until(healthy, timeout, "a leader with every standby streaming")
        return found

    def wait_replayed(self, leader: Node, timeout: float = 60) -> None:
        """Until every other running node has replayed all the leader has written so far
        (streaming is not enough: a standby may stream and still be behind), so that what
        a test loses on purpose afterwards is only what follows."""
        with psycopg.connect(leader.url, autocommit=True, connect_timeout=5) as conn:
            lsn = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]
        others = [
            self.node(m["name"])
            for m in self.members()
            if m["name"] != leader.name and m["state"] in ("running", "streaming")
        ]

        def replayed(node: Node) -> bool:
            try:
                with psycopg.connect(node.url, autocommit=True, connect_timeout=2) as conn:
                    return bool(
                        conn.execute(
                            "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (lsn,)
                        ).fetchone()[0]
                    )
            except psycopg.Error:
                return False

        for node in others:
            wait_until(lambda node=node: replayed(node), timeout, f"{node.name} to replay {lsn}")

    def stop(self) -> None:
        """Kill everything: the cluster is thrown away, so there is nothing to shut down
        cleanly (and a clean Patroni shutdown costs seconds per node)."""
        for node in self.nodes:
            node.kill()
            node.relay.close()
        if self.etcd is not None and self.etcd.poll() is None:
            self.etcd.kill()
            self.etcd.wait()

    def logs(self) -> str:
        """The tail of every node's Patroni log, for a failure message."""
        parts = []
        for node in self.nodes:
            with contextlib.suppress(OSError):
                tail = node.log.read_text(errors="replace").splitlines()[-25:]
                parts.append(f"--- {node.name} (port {node.port})\n" + "\n".join(tail))
        return "\n".join(parts)

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
