-- +goose Up
-- event_conflicts keeps deliveries that reused an event id with different
-- content: they are never processed, only recorded here for inspection
-- (and answered 409 when the receiver can tell). One row per distinct
-- content per event.
CREATE TABLE event_conflicts (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id        text        NOT NULL,
    source          text        NOT NULL,
    stored_sha256   bytea       NOT NULL,
    received_sha256 bytea       NOT NULL,
    body            bytea       NOT NULL,
    received_at     timestamptz,
    recorded_at     timestamptz NOT NULL DEFAULT now(),
    UNIQUE (event_id, received_sha256)
);

-- +goose Down
DROP TABLE event_conflicts;
