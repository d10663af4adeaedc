"""What the bench workloads measure of themselves and of the server beside them: latency
percentiles, peak memory, and CPU seconds (the engine's process, and the local
PostgreSQL's processes), shared by bench/run_bench.py, bench/dbos_workload.py and
bench/workers.py."""

from __future__ import annotations

import os
import resource


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def peak_rss_mb() -> float:
    """This process's peak resident set. VmHWM, not ru_maxrss: Linux carries ru_maxrss
    over fork and exec, so a child would report at least its parent's size."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass  # not Linux
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def own_cpu_seconds() -> float:
    """User and system CPU of this process, every thread of it."""
    t = os.times()
    return t.user + t.system


def server_cpu_seconds() -> float | None:
    """User and system CPU of the PostgreSQL processes on this machine, the backends that
    have exited included (the postmaster's reaped children), from /proc; None where they
    cannot be read (another machine, not Linux). The whole server's: other databases'
    work counts too, so read it on a server the bench has to itself."""
    total, found = 0, False
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return None
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii") as f:
                stat = f.read()
        except OSError:
            continue  # gone meanwhile
        name, rest = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :]
        if name != "postgres" and not name.startswith("postgres:"):
            continue
        fields = rest.split()
        # utime, stime, cutime, cstime: fields 14-17 of stat, 12-15 after the name
        total += sum(int(v) for v in fields[11:15])
        found = True
    return total / os.sysconf("SC_CLK_TCK") if found else None


def cpu_now() -> tuple[float, float | None]:
    """This process's and the local server's CPU seconds, for cpu_per_step."""
    return own_cpu_seconds(), server_cpu_seconds()


def cpu_per_step(
    start: tuple[float, float | None], end: tuple[float, float | None], steps: int
) -> dict[str, float | None]:
    """The bench's two CPU columns between two cpu_now() readings: the engine's own
    process and the server's, in ms per step (the server's None where unreadable)."""
    own = (end[0] - start[0]) * 1000 / steps
    server = None if start[1] is None or end[1] is None else (end[1] - start[1]) * 1000 / steps
    return {"engine_cpu_ms_per_step": own, "server_cpu_ms_per_step": server}
