-- Back to local tables on the coordinator (with their rows); nothing to do
-- on plain PostgreSQL.
DO $$
DECLARE
  t text;
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN
    RETURN;
  END IF;
  FOREACH t IN ARRAY ARRAY['decision_log', 'progress', 'window_ids', 'versions', 'state'] LOOP
    IF EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = to_regclass(t)) THEN
      EXECUTE format('SELECT undistribute_table(%L, cascade_via_foreign_keys => false)', t);
    END IF;
  END LOOP;
END
$$;
