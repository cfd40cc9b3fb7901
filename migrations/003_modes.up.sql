-- The tables of the decision rules beside last-seen (state).

-- window_ids: window mode. Each message id of a service is remembered until
-- expires_at; an id seen again before then is a duplicate. Expired rows
-- mean nothing (they read as absent) and are deleted by the cleanup in
-- small batches, walking the expiry index.
CREATE TABLE window_ids (
    service       text        NOT NULL,
    id            bytea       NOT NULL,
    expires_at    timestamptz NOT NULL,
    -- When the id was forwarded, and the digest and source of that record.
    forwarded_at  timestamptz NOT NULL,
    digest        bytea       NOT NULL,
    src_topic     text,
    src_partition int,
    src_offset    bigint,
    PRIMARY KEY (service, id)
);

-- For the cleanup: one service's expired ids, oldest first.
CREATE INDEX window_ids_expiry ON window_ids (service, expires_at);

-- versions: version mode. The highest version forwarded per
-- (service, entity), with when, and the digest and source of that record.
-- No index beside the primary key, so a rewrite stays a HOT update (as for
-- state).
CREATE TABLE versions (
    service       text        NOT NULL,
    entity        bytea       NOT NULL,
    version       bigint      NOT NULL,
    digest        bytea       NOT NULL,
    updated_at    timestamptz NOT NULL,
    src_topic     text,
    src_partition int,
    src_offset    bigint,
    PRIMARY KEY (service, entity)
) WITH (fillfactor = 85);
