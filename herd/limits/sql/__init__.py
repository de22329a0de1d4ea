"""Migrations of herd.limits (see herd.db.postgres.migrate)."""
