"""SQL files of the PostgreSQL broker: its migrations (NNNN_name.sql, applied by
herd.db.postgres.migrate) and its named statements (queries.sql, read by
herd.db.queries)."""
