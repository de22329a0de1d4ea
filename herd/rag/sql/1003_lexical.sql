-- Full-text search beside the vectors (hybrid retrieval): each generation's table
-- gets a tsvector column in the text-search configuration its collection chose at
-- ingest (english, indonesian, simple...). PostgreSQL 13 and later ship an
-- `indonesian` Snowball stemmer; a server built without it gets a `simple`-based
-- configuration of that name (lowercased words, no stemming, no stopwords), so
-- `--language indonesian` works everywhere, only without stemming there.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_ts_config WHERE cfgname = 'indonesian') THEN
        CREATE TEXT SEARCH CONFIGURATION indonesian (COPY = simple);
    END IF;
END
$$;
