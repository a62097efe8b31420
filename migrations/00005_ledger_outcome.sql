-- +goose Up
-- outcome says what the event's effects did: applied (a handler wrote its
-- effect) or skipped (no handler had anything to do with it). A constant
-- default makes this ALTER instant on a live ledger (no table rewrite, a
-- brief ACCESS EXCLUSIVE lock); existing rows read as applied.
ALTER TABLE processed_events ADD COLUMN outcome text NOT NULL DEFAULT 'applied'
    CHECK (outcome IN ('applied', 'skipped'));

-- +goose Down
ALTER TABLE processed_events DROP COLUMN outcome;
