-- +goose Up
-- The reconciler (package reconcile, eventsctl reconcile): runs that compare
-- a provider's own record of events with the ledger and feed the missing
-- ones into the pipeline. A run lists its window newest first, keeping the
-- missing events and its cursor in one transaction per page, then injects
-- what it kept oldest first; a run killed in either phase is resumed by the
-- next one for its source.
CREATE TABLE reconcile_runs (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    source       text        NOT NULL,
    -- events created in [window_start, window_end]
    window_start timestamptz NOT NULL,
    window_end   timestamptz NOT NULL,
    types        text[]      NOT NULL DEFAULT '{}',
    state        text        NOT NULL DEFAULT 'listing'
                             CHECK (state IN ('listing', 'injecting', 'done')),
    -- the last event id of the last page kept (starting_after of the next)
    cursor       text        NOT NULL DEFAULT '',
    pages        integer     NOT NULL DEFAULT 0,
    listed       integer     NOT NULL DEFAULT 0,
    present      integer     NOT NULL DEFAULT 0,
    missing      integer     NOT NULL DEFAULT 0,
    injected     integer     NOT NULL DEFAULT 0,
    -- found missing, then delivered by a webhook before the injection
    arrived      integer     NOT NULL DEFAULT 0,
    invalid      integer     NOT NULL DEFAULT 0,
    started_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz
);
-- at most one unfinished run per source
CREATE UNIQUE INDEX reconcile_runs_open ON reconcile_runs (source) WHERE state <> 'done';
CREATE INDEX reconcile_runs_finished ON reconcile_runs (source, finished_at) WHERE state = 'done';

-- The events a run found missing, as the provider's API returned them.
CREATE TABLE reconcile_missing (
    run_id      bigint      NOT NULL REFERENCES reconcile_runs (id) ON DELETE CASCADE,
    event_id    text        NOT NULL,
    event_type  text        NOT NULL,
    created     timestamptz NOT NULL,
    -- the position in the newest-first listing: within one second of
    -- created, a larger seq is older
    seq         bigint      NOT NULL,
    body        bytea       NOT NULL,
    -- injected, arrived (a webhook was first) or invalid (our decoder
    -- refused it: see detail)
    outcome     text        CHECK (outcome IN ('injected', 'arrived', 'invalid')),
    detail      text        NOT NULL DEFAULT '',
    settled_at  timestamptz,
    PRIMARY KEY (run_id, event_id)
);
CREATE INDEX reconcile_missing_pending ON reconcile_missing (run_id, created, seq DESC) WHERE outcome IS NULL;

-- +goose Down
DROP TABLE reconcile_missing;
DROP TABLE reconcile_runs;
