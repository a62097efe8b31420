-- +goose Up
-- The transactional outbox: messages effects handlers enqueue in their
-- event's transaction (package outbox), published by the relay after
-- COMMIT. The relay claims unpublished rows by state, never by an id
-- high-water mark (a transaction that commits late would be skipped), and
-- per object only the lowest unpublished sequence number is ever in
-- flight.
CREATE TABLE outbox (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- <event key>/<effect>: a replay of the event cannot enqueue it twice;
    -- the message's MessageId downstream, for consumers to dedupe on
    idempotency_key text        NOT NULL UNIQUE,
    event_id        text        NOT NULL,
    effect          text        NOT NULL,
    -- the ordering key and the message's place in it, taken in the
    -- enqueuing transaction
    object_id       text        NOT NULL,
    seq             bigint      NOT NULL,
    exchange        text        NOT NULL,
    routing_key     text        NOT NULL,
    headers         jsonb       NOT NULL DEFAULT '{}',
    body            bytea       NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    published_at    timestamptz,
    attempts        integer     NOT NULL DEFAULT 0,
    last_error      text        NOT NULL DEFAULT '',
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    -- set after too many failed publishes: the row and the later rows of
    -- its object wait for an operator (eventsctl outbox retry)
    parked_at       timestamptz,
    UNIQUE (object_id, seq)
);
-- the relay's claim: unpublished, not parked, in id order
CREATE INDEX outbox_pending ON outbox (id) WHERE published_at IS NULL AND parked_at IS NULL;
CREATE INDEX outbox_unpublished ON outbox (object_id, seq) WHERE published_at IS NULL;
CREATE INDEX outbox_published ON outbox (published_at) WHERE published_at IS NOT NULL;

CREATE TABLE outbox_sequences (
    object_id text   PRIMARY KEY,
    last_seq  bigint NOT NULL
);

-- Operators' actions on parked rows, like dlq_audit.
CREATE TABLE outbox_audit (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at              timestamptz NOT NULL DEFAULT now(),
    operator        text        NOT NULL,
    via             text        NOT NULL,
    action          text        NOT NULL,
    outbox_id       bigint      NOT NULL,
    idempotency_key text        NOT NULL,
    detail          text        NOT NULL DEFAULT ''
);

-- +goose Down
DROP TABLE outbox_audit;
DROP TABLE outbox_sequences;
DROP TABLE outbox;
