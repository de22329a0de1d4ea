-- A reduce larger than its model's context runs in rounds (herd.llm.eval.rounds): round
-- 1 reduces batches of the map's answers that fit, each later round the answers of the
-- one before, until one remains. A piece is then addressed by its round too, and each
-- round of more than one piece keeps its own fan-in count. Every other stage's pieces
-- are round 1.
ALTER TABLE herd_eval_pieces ADD COLUMN round integer NOT NULL DEFAULT 1;
ALTER TABLE herd_eval_pieces DROP CONSTRAINT herd_eval_pieces_pkey;
ALTER TABLE herd_eval_pieces ADD PRIMARY KEY (batch, path, stage, round, seq);

ALTER TABLE herd_eval_fanin ADD COLUMN round integer NOT NULL DEFAULT 1;
ALTER TABLE herd_eval_fanin DROP CONSTRAINT herd_eval_fanin_pkey;
ALTER TABLE herd_eval_fanin ADD PRIMARY KEY (batch, path, stage, round);
