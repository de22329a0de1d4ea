"""Migrations of herd.llm (see herd.db.postgres.migrate)."""
