-- The bounded mode (herd.semantic.bounded): each entry keeps the last verdicts on the
-- hits it served or was checked for, as [similarity, 1 right / 0 wrong] pairs, at
-- most herd.semantic.bounded.KEPT of them. They go with the row: deleted with it,
-- emptied when the entry's value is recomputed.
ALTER TABLE herd_semantic ADD COLUMN verdicts jsonb NOT NULL DEFAULT '[]';
