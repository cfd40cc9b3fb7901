-- Every forwarded record rewrites its state row. With an index on
-- updated_at each rewrite also inserted into both indexes; without it the
-- rewrite is a HOT update (same page, no index work), which cut
-- PostgreSQL's CPU per decided record by about a third. PruneState walks
-- the primary key instead.
DROP INDEX IF EXISTS state_service_updated_at;
