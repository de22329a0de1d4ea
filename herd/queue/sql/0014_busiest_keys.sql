-- The keys with the most waiting jobs, for the busiest keys a dashboard shows: with the
-- keys that have a job running (found from the leased jobs), they hold every key of the
-- top N by running + waiting, so the read costs O(active work + N) and not a sort of
-- every key with work (100,000 tenants waiting: 100,000 rows a poll). waiting is in
-- herd_key_counts_turn's predicate already, so its updates were not HOT before either.
CREATE INDEX herd_key_counts_waiting ON herd_key_counts (waiting DESC) WHERE waiting > 0;
