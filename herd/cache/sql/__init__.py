"""Migrations of herd.cache (see herd.db.postgres.migrate)."""
