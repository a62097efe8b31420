-- +goose Up
-- The current state of each Stripe object the built-in payment effect
-- keeps (package payments), written in the transaction of the event that
-- brought it, and one payment_events row per event that described one:
-- applied, superseded (older than the state), illegal_transition, or
-- needs_refresh (as new as the state, and not comparable with it). New
-- tables only: the payments table keeps its meaning (one row per payment
-- event), so the migration is safe on a live ledger.
CREATE TABLE payment_intents (
    id              text        PRIMARY KEY,
    status          text        NOT NULL,
    -- the event whose state is current, and its created time
    status_event_id text        NOT NULL,
    status_created  timestamptz NOT NULL,
    amount          bigint      NOT NULL DEFAULT 0,
    -- cumulative amounts are snapshots: the largest reported wins
    amount_received bigint      NOT NULL DEFAULT 0,
    amount_refunded bigint      NOT NULL DEFAULT 0,
    currency        text        NOT NULL DEFAULT '',
    livemode        boolean     NOT NULL DEFAULT false,
    -- two events of the same second whose states cannot be ordered: the
    -- state should be fetched from Stripe
    needs_refresh   boolean     NOT NULL DEFAULT false,
    updated_at      timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE charges (
    id                text        PRIMARY KEY,
    payment_intent_id text        NOT NULL DEFAULT '',
    status            text        NOT NULL,
    status_event_id   text        NOT NULL,
    status_created    timestamptz NOT NULL,
    amount            bigint      NOT NULL DEFAULT 0,
    amount_captured   bigint      NOT NULL DEFAULT 0,
    amount_refunded   bigint      NOT NULL DEFAULT 0,
    currency          text        NOT NULL DEFAULT '',
    needs_refresh     boolean     NOT NULL DEFAULT false,
    updated_at        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX charges_payment_intent_id ON charges (payment_intent_id);

CREATE TABLE payment_events (
    event_id      text        PRIMARY KEY,
    object_type   text        NOT NULL,
    object_id     text        NOT NULL,
    event_type    text        NOT NULL,
    event_created timestamptz NOT NULL,
    status        text        NOT NULL,
    outcome       text        NOT NULL CHECK (outcome IN ('applied', 'superseded', 'illegal_transition', 'needs_refresh')),
    -- the object's state when the event was decided
    from_status   text        NOT NULL DEFAULT '',
    recorded_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX payment_events_object ON payment_events (object_type, object_id);

-- +goose Down
DROP TABLE payment_events;
DROP TABLE charges;
DROP TABLE payment_intents;
