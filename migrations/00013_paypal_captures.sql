-- +goose Up
-- The current state of each PayPal capture the built-in payment effect
-- keeps (package payments), written in the transaction of the event that
-- brought it; its events are recorded in payment_events with object_type
-- 'paypal_capture', as Stripe's are. A table of its own rather than a
-- generalised charges table: PayPal's amounts are decimal strings in the
-- currency's unit (numeric here, never floats), its statuses are its own,
-- and a refund reaches the capture as evidence before the capture's state
-- may be known. New table only: safe on a live ledger.
CREATE TABLE paypal_captures (
    id               text        PRIMARY KEY,
    -- '' while only refunds of the capture have come (its state cannot be
    -- told without its amount, which only the capture's own events carry)
    status           text        NOT NULL DEFAULT '',
    -- the event whose state is current, and the time that orders it
    status_event_id  text        NOT NULL DEFAULT '',
    status_created   timestamptz,
    -- the capture's amount (NULL until an event of the capture itself),
    -- PayPal's fee and the net of seller_receivable_breakdown
    amount           numeric,
    currency         text        NOT NULL DEFAULT '',
    paypal_fee       numeric,
    net_amount       numeric,
    -- refunds and reversals: the largest total_refunded_amount reported
    -- wins, whatever the order; the newest refund event, and whether one
    -- was a reversal
    amount_refunded  numeric     NOT NULL DEFAULT 0,
    reversed         boolean     NOT NULL DEFAULT false,
    refund_event_id  text        NOT NULL DEFAULT '',
    refund_created   timestamptz,
    -- supplementary_data.related_ids.order_id and custom_id: what links a
    -- capture to the team's order
    order_id         text        NOT NULL DEFAULT '',
    custom_id        text        NOT NULL DEFAULT '',
    -- contradictory evidence (a capture completed and declined): the
    -- state should be fetched from PayPal
    needs_refresh    boolean     NOT NULL DEFAULT false,
    updated_at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX paypal_captures_needs_refresh ON paypal_captures (id) WHERE needs_refresh;

-- +goose Down
DROP TABLE paypal_captures;
