-- The decision log's arrays are compressed with lz4 instead of pglz:
-- compressing each decided batch's row (tens of KB) with pglz was 9% of
-- PostgreSQL's CPU per decided record in make bench; lz4 costs a fraction
-- of that and keeps the WAL about as small. A server built without lz4
-- keeps pglz.
DO $$
BEGIN
    ALTER TABLE decision_log ALTER COLUMN offsets SET COMPRESSION lz4,
        ALTER COLUMN decisions SET COMPRESSION lz4,
        ALTER COLUMN entities SET COMPRESSION lz4;
EXCEPTION WHEN feature_not_supported THEN
    RAISE NOTICE 'decision_log keeps pglz: %', SQLERRM;
END
$$;
