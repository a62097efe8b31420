-- +goose Up
-- Handler sets and their generations (package store, fence.go): a release
-- is one deploy of a worker (WORKER_RELEASE; without it, its handler set),
-- and each announcement or first registration of a release gets the next
-- generation. The newest generation is current, and a worker commits only
-- while its handler set is the current generation's. set_id and handlers
-- are NULL while a release is announced (the chart's migration hook) and
-- no worker of it has registered.
CREATE TABLE handler_generations (
    generation    bigint PRIMARY KEY CHECK (generation > 0),
    release       text NOT NULL,
    set_id        text,
    handlers      jsonb,
    announced_at  timestamptz NOT NULL DEFAULT now(),
    registered_at timestamptz
);
CREATE INDEX handler_generations_release ON handler_generations (release, generation DESC);

-- The generation of the worker that committed each event, so "which events
-- ran without handler X" is a join with handler_generations. NULL for rows
-- committed before this migration or by a tool without a generation.
-- Nullable without a default: instant on a live ledger.
ALTER TABLE processed_events ADD COLUMN generation bigint;

-- +goose Down
ALTER TABLE processed_events DROP COLUMN generation;
DROP TABLE handler_generations;
