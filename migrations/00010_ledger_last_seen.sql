-- +goose Up
-- A duplicate found in the ledger is acked only after a write of its own
-- has reached the synchronous standby (package store, SetSynchronous): the
-- worker touches last_seen_at of the duplicates' rows, whose WAL is after
-- their first COMMIT's. A nullable column without a default: instant on a
-- live ledger.
ALTER TABLE processed_events ADD COLUMN last_seen_at timestamptz;

-- +goose Down
ALTER TABLE processed_events DROP COLUMN last_seen_at;
