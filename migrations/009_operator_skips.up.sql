-- operator_skips: an operator's step past one input record (`dam state
-- skip`): who, when and why, and what the record had been decided before
-- (0: not decided, the partition halted before it; 1 forward or 3
-- invalid: decided and not delivered, the partition halted delivering
-- it). The decision log marks the offset skipped (decision 6); this table
-- says by whom, for `dam explain --offset`. Kept as long as the decision
-- log (decision_log.keep), pruned with it.
--
-- On Citus (migration 005) it is distributed by part, co-located with
-- progress and decision_log: a skip locks the progress row, changes the
-- log and records itself in one shard. Its constraint is named, and
-- everything is one DO block, as tern runs a migration as one statement
-- (see 007, 008).
DO $$
BEGIN
  CREATE TABLE operator_skips (
    grp         text        NOT NULL,
    topic       text        NOT NULL,
    part        int         NOT NULL,
    skip_offset bigint      NOT NULL,
    skipped_by  text        NOT NULL,
    reason      text        NOT NULL,
    skipped_at  timestamptz NOT NULL,
    was         smallint    NOT NULL,
    entity      bytea,
    CONSTRAINT operator_skips_pkey PRIMARY KEY (grp, topic, part, skip_offset)
  );
  IF NOT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN
    RETURN;
  END IF;
  -- (A separate statement: pg_dist_partition exists only with citus.)
  IF EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = to_regclass('progress')) THEN
    PERFORM create_distributed_table('operator_skips', 'part', colocate_with => 'progress');
  END IF;
END
$$;
