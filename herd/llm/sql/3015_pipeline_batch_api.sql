-- A pipeline's stage through the Batch API (herd.llm.eval.pipebatch): its pieces are
-- gathered into chunks, one provider batch each (herd_eval_provider_batches.chunk).
-- chunk NULL: not gathered yet; 'sync': answered by a job of its own (an exact-cache
-- hit, or a request the provider batch failed, retried once synchronously). The chunk
-- is written before its submit job is enqueued, so a run again after a crash re-sends
-- the same chunk (one provider batch) rather than gathering the pieces anew.
ALTER TABLE herd_eval_pieces ADD COLUMN chunk text;
CREATE INDEX herd_eval_pieces_chunk ON herd_eval_pieces (chunk, key) WHERE chunk IS NOT NULL;
