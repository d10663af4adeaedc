"""The history tables' months (sql/functions/history.sql): making the coming months'
partitions, archiving an ended month, and listing them."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from .base import Conn, objects


@dataclass(frozen=True)
class MadePartition:
    table_name: str
    partition_name: str
    rows_moved: int  # rows of its range the default partition held, moved into it


@dataclass(frozen=True)
class ArchivedPartition:
    table_name: str
    partition_name: str
    row_count: int


@dataclass(frozen=True)
class Partition:
    table_name: str
    partition_name: str
    archived: bool
    month: dt.date | None  # None for the default partition
    row_estimate: int
    total_bytes: int


def ensure_partitions(conn: Conn, *, months_ahead: int = 2) -> list[MadePartition]:
    """orch8.ensure_history_partitions: this month's and the next ``months_ahead`` months'
    partitions that do not exist yet (a no-op when they do)."""
    return objects(
        conn,
        MadePartition,
        "SELECT table_name, partition_name, rows_moved"
        " FROM orch8.ensure_history_partitions(%(months_ahead)s)",
        {"months_ahead": months_ahead},
    )


def archive_month(conn: Conn, *, month: dt.date) -> list[ArchivedPartition]:
    """orch8.archive_history_month: the month's partitions move to schema orch8_archive.
    HistoryInUse while something of the month is in flight."""
    return objects(
        conn,
        ArchivedPartition,
        "SELECT table_name, partition_name, row_count FROM orch8.archive_history_month(%(month)s)",
        {"month": month},
    )


def partitions(conn: Conn) -> list[Partition]:
    """Every partition of the history tables, live and archived."""
    return objects(
        conn,
        Partition,
        "SELECT table_name, partition_name, archived, month, row_estimate, total_bytes"
        " FROM orch8.history_partitions()",
    )
