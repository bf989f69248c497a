"""Bytes on disk: durable writes and locks, the run dir's row schema, row field checks."""
