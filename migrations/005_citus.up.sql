-- On a database with the citus extension (distributed PostgreSQL), spread
-- dam's tables over the worker nodes; on plain PostgreSQL this does
-- nothing.
--
-- state, versions and window_ids are distributed by identity (entity, id),
-- co-located: one service's identities spread over every worker, and a
-- decide touches only the shards of its batch's identities. progress and
-- decision_log are distributed by input partition (part), co-located: a
-- decide's fence, progress and log rows sit in one shard, written by one
-- worker, and every read of recovery is a single-shard (router) query.
-- Reference tables (a copy on every node, each write committed on all of
-- them) would cost every decide a write on every worker.
--
-- Idempotent: a table that is distributed already is left alone (a second
-- `dam migrate` holds tern's advisory lock on the coordinator, then finds
-- nothing to do). Tables holding rows are distributed with their rows: the
-- rows are copied into the shards and the local copy is truncated.
DO $$
DECLARE
  t record;
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN
    RETURN;
  END IF;
  -- Creating shards and copying rows over several connections inside this
  -- transaction: one connection per worker keeps it visible to itself.
  SET LOCAL citus.multi_shard_modify_mode TO 'sequential';
  FOR t IN SELECT * FROM (VALUES
      (1, 'state', 'entity', 'default'),
      (2, 'versions', 'entity', 'state'),
      (3, 'window_ids', 'id', 'state'),
      (4, 'progress', 'part', 'default'),
      (5, 'decision_log', 'part', 'progress')) AS v(n, tbl, col, coloc)
    ORDER BY n
  LOOP
    IF NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = to_regclass(t.tbl)) THEN
      -- A colocation group of its own for the first table of each kind:
      -- dam's shards do not share a group with another application's.
      EXECUTE format('SELECT create_distributed_table(%L, %L, colocate_with => %L)',
        t.tbl, t.col, CASE WHEN t.coloc = 'default' THEN 'none' ELSE t.coloc END);
      IF EXISTS (SELECT 1 FROM pg_proc WHERE proname = 'truncate_local_data_after_distributing_table') THEN
        EXECUTE format('SELECT truncate_local_data_after_distributing_table(%L)', t.tbl);
      END IF;
    END IF;
  END LOOP;
END
$$;
