-- Primary keys identity first: state and versions keyed (entity, service),
-- window_ids (id, service), instead of service first.
--
-- A decide reads its batch's identities of one service by key (service =
-- $1 AND entity = ANY($2)): thousands of B-tree descents per batch. With
-- the service first, every comparison on the way down compared the
-- service (text: a function call, and the entity's offset in the index
-- row cannot be cached after a variable-length column) before the entity;
-- identity first, the service is compared only at the identity's own
-- entries. make bench: about 7% less PostgreSQL CPU per decided record.
--
-- What walks one service (Count, ResetService, PruneState) reads a second
-- index, (service, identity), whose predicate is always true: those
-- statements repeat it, a decide's read does not, so the planner never
-- reads a batch through the service's part of that index (see byService
-- in dedup/ops.go). Only new identities pay for it (an index entry); a
-- rewrite stays a HOT update, as neither column ever changes.
--
-- Each rebuild holds its table's ACCESS EXCLUSIVE lock: deciders wait
-- for it (see docs/operations.md, Upgrade). One DO block: Citus refuses
-- DROP and ADD CONSTRAINT in one ALTER TABLE, and tern runs a migration
-- as one statement. Idempotent, like 005: a table already keyed identity
-- first is left alone.
DO $$
DECLARE
  t record;
BEGIN
  FOR t IN SELECT * FROM (VALUES ('state', 'entity'), ('versions', 'entity'), ('window_ids', 'id')) AS v(tbl, col) LOOP
    IF (SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
        WHERE i.indexrelid = to_regclass(t.tbl || '_pkey')) = 'service' THEN
      EXECUTE format('ALTER TABLE %I DROP CONSTRAINT %I', t.tbl, t.tbl || '_pkey');
      EXECUTE format('ALTER TABLE %I ADD CONSTRAINT %I PRIMARY KEY (%I, service)', t.tbl, t.tbl || '_pkey', t.col);
    END IF;
    EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON %I (service, %I) WHERE octet_length(%I) >= 0',
      t.tbl || '_by_service', t.tbl, t.col, t.col);
  END LOOP;
END
$$;
