-- +goose Up
-- The event archive (package backfill): the body and identity of every
-- event the worker commits, written in the event's own transaction while
-- EVENT_ARCHIVE is on (off by default). A backfill needs it to run a
-- handler over events committed without it. Pruned by eventsctl prune
-- (ARCHIVE_RETENTION).
CREATE TABLE event_archive (
    event_id     text PRIMARY KEY,
    source       text NOT NULL,
    provider_id  text NOT NULL,
    event_type   text NOT NULL,
    created      timestamptz,
    object_type  text NOT NULL DEFAULT '',
    object_id    text NOT NULL DEFAULT '',
    body         bytea NOT NULL,
    archived_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX event_archive_archived_at ON event_archive (archived_at);

-- A backfill: one named handler run over the events committed without it
-- (eventsctl effects backfill). The current workers that run the handler
-- do the work, at most rate events a second between them: each takes the
-- next slot by moving next_at.
CREATE TABLE backfills (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    handler     text NOT NULL,
    since       timestamptz NOT NULL,
    until       timestamptz,
    rate        double precision NOT NULL CHECK (rate > 0),
    created_at  timestamptz NOT NULL DEFAULT now(),
    created_by  text NOT NULL DEFAULT '',
    next_at     timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz
);
CREATE INDEX backfills_open ON backfills (handler) WHERE finished_at IS NULL;

-- One (event, handler) to run. Unique per (handler, event_id): a second
-- backfill, or the same one run twice, never queues it again, and the row
-- is marked done in the transaction of the handler's effect, so the effect
-- commits once. outcome: applied, skipped (the handler returned Skip),
-- failed (Permanent, a panic, or max attempts).
CREATE TABLE backfill_items (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    backfill_id bigint NOT NULL REFERENCES backfills (id) ON DELETE CASCADE,
    handler     text NOT NULL,
    event_id    text NOT NULL,
    attempts    int NOT NULL DEFAULT 0,
    last_error  text,
    -- A failed try is tried again from retry_at on.
    retry_at    timestamptz,
    outcome     text,
    finished_at timestamptz,
    UNIQUE (handler, event_id)
);
CREATE INDEX backfill_items_pending ON backfill_items (backfill_id, id) WHERE finished_at IS NULL;
CREATE INDEX backfill_items_finished_at ON backfill_items (finished_at) WHERE finished_at IS NOT NULL;

-- +goose Down
DROP TABLE backfill_items;
DROP TABLE backfills;
DROP TABLE event_archive;
