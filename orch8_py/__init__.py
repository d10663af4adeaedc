"""orch8-py: a durable workflow engine whose state and transitions live in PostgreSQL."""

__version__ = "0.1.0"
