"""Migrations of herd.locks (see herd.db.postgres.migrate)."""
