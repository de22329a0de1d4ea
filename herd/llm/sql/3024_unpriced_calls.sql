-- How many of a kind's paid calls had no price: the kinds' totals sum the priced ones
-- alone (cost NULL adds nothing), so without this count the dashboard, `herd status`
-- and /metrics showed a kind of priced and unpriced calls as the priced sum, and the
-- unpriced calls' unknown cost as nothing. Counted as a row closes without a cost (an
-- open call closed, or a row written closed), by triggers that fire for such rows only:
-- herd_ledger_count has just written the kind's totals row in the same transaction, so
-- they take no lock it does not hold already. Rows already written are counted once
-- here; rows purged before (HERD_LEDGER_TTL) are not known any more.
ALTER TABLE herd_eval_ledger_totals ADD COLUMN unpriced bigint NOT NULL DEFAULT 0;

UPDATE herd_eval_ledger_totals t
   SET unpriced = (SELECT count(*) FROM herd_eval_ledger l
                    WHERE l.kind = t.kind AND l.state = 'closed' AND l.cost IS NULL)
 WHERE t.kind IN ('call', 'lost', 'failed', 'cut_short');

CREATE FUNCTION herd_ledger_count_unpriced() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE herd_eval_ledger_totals SET unpriced = unpriced + 1 WHERE kind = NEW.kind;
    RETURN NULL;
END $$;

CREATE TRIGGER herd_eval_ledger_unpriced_insert AFTER INSERT ON herd_eval_ledger
    FOR EACH ROW WHEN (NEW.state = 'closed' AND NEW.cost IS NULL
                       AND NEW.kind IN ('call', 'lost', 'failed', 'cut_short'))
    EXECUTE FUNCTION herd_ledger_count_unpriced();

CREATE TRIGGER herd_eval_ledger_unpriced_close AFTER UPDATE ON herd_eval_ledger
    FOR EACH ROW WHEN (OLD.state = 'open' AND NEW.state = 'closed' AND NEW.cost IS NULL
                       AND NEW.kind IN ('call', 'lost', 'failed', 'cut_short'))
    EXECUTE FUNCTION herd_ledger_count_unpriced();
