-- +goose Up
-- processed_events is the dedupe ledger and the only source of truth for
-- "this event has had its effect". One row per provider event, written in the
-- same transaction as the event's business row.
CREATE TABLE processed_events (
    event_id       text        PRIMARY KEY,
    source         text        NOT NULL DEFAULT 'stripe',
    event_type     text        NOT NULL,
    -- sha256 of the raw body as signed by the provider, to tell a replay of
    -- the same event from a different body sent under the same id.
    payload_sha256 bytea       NOT NULL,
    received_at    timestamptz,
    processed_at   timestamptz NOT NULL DEFAULT now(),
    -- the processing attempt (1 = first delivery) that committed.
    attempt        integer     NOT NULL DEFAULT 1
);
-- Retention jobs delete by age; providers retry for days, so rows must stay
-- at least 30 days.
CREATE INDEX processed_events_processed_at_idx ON processed_events (processed_at);

-- payments holds the business effect: one row per payment event. There is no
-- foreign key to processed_events, so pruning the ledger never touches it.
CREATE TABLE payments (
    id                bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id          text        NOT NULL UNIQUE,
    payment_intent_id text        NOT NULL,
    event_type        text        NOT NULL,
    amount_cents      bigint      NOT NULL CHECK (amount_cents >= 0),
    currency          char(3)     NOT NULL,
    status            text        NOT NULL,
    livemode          boolean     NOT NULL DEFAULT false,
    event_created_at  timestamptz,
    created_at        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX payments_payment_intent_id_idx ON payments (payment_intent_id);

-- +goose Down
DROP TABLE payments;
DROP TABLE processed_events;
