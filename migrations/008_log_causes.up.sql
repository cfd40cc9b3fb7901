-- decision_log.causes: why each invalid entry of a logged batch was
-- invalid, in the words of the decision (bad input's error, or the
-- store's refusal of the record), so that a recovery delivering its dead
-- letter again says the same: the record alone may look fine by then (the
-- store refused it, or the route's configuration changed). NULL when the
-- batch logs no invalid entry; otherwise one element per entry of
-- offsets, NULL but for the invalid ones. Batches logged before this
-- migration have none: recovery then classifies their records again.
--
-- On Citus (decision_log is distributed by part, migration 005) both
-- statements are propagated to every shard. Citus refuses a CHECK
-- constraint declared with the column it adds, so the constraint is added
-- by a statement of its own, named; one DO block, as in 007, as tern runs
-- a migration as one statement.
DO $$
BEGIN
  ALTER TABLE decision_log ADD COLUMN causes text[];
  ALTER TABLE decision_log ADD CONSTRAINT decision_log_causes_check
    CHECK (causes IS NULL OR cardinality(causes) = cardinality(offsets));
END
$$;
