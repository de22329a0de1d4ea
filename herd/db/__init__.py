"""herd's one connection layer: every store takes its PostgreSQL and Redis
connections from the process's shared pools here (see herd.db.postgres and
herd.db.redis), with errors that name the store and the setting that failed."""
