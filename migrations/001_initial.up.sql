-- state: the digest last forwarded for each (service, entity).
-- fillfactor leaves room on each page so that rewriting a row can stay on
-- its page.
CREATE TABLE state (
    service       text        NOT NULL,
    entity        bytea       NOT NULL,
    -- NULL only inside a Decide transaction: a placeholder row that locks a
    -- new identity. A committed NULL (never expected) reads as absent.
    digest        bytea,
    updated_at    timestamptz NOT NULL DEFAULT now(),
    -- Where the stored digest came from (NULL when set by Check).
    src_topic     text,
    src_partition int,
    src_offset    bigint,
    PRIMARY KEY (service, entity)
) WITH (fillfactor = 85);

-- For PruneState: delete a service's rows not changed for a while.
CREATE INDEX state_service_updated_at ON state (service, updated_at);

-- progress: per input partition, the next offset to decide (P, NULL until
-- the owner sets it) and the fencing epoch bumped by every Acquire.
CREATE TABLE progress (
    grp         text   NOT NULL,
    topic       text   NOT NULL,
    part        int    NOT NULL,
    next_offset bigint,
    epoch       bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (grp, topic, part)
);

-- decision_log: one row per decided batch [first_offset, end_offset) holding
-- its Forward (1) and Invalid (3) records; offsets of a logged batch with no
-- entry were duplicates. Pruned below Kafka's committed offset.
CREATE TABLE decision_log (
    grp          text     NOT NULL,
    topic        text     NOT NULL,
    part         int      NOT NULL,
    first_offset bigint   NOT NULL,
    end_offset   bigint   NOT NULL,
    offsets      bigint[] NOT NULL,
    decisions    smallint[] NOT NULL,
    entities     bytea[]  NOT NULL,
    logged_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (grp, topic, part, first_offset),
    CHECK (end_offset >= first_offset),
    CHECK (cardinality(offsets) = cardinality(decisions)
       AND cardinality(offsets) = cardinality(entities))
);
