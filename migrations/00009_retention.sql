-- +goose Up
-- Retention (package retention, eventsctl prune): the ledger and the audit
-- tables are pruned in batches by age. Each run is recorded, with the
-- retentions it used: the reconciler refuses a window that reaches past the
-- ledger's retention (an event whose ledger row was pruned would be fed in,
-- and processed, again).
CREATE TABLE prune_runs (
    id                 bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    ledger_retention   interval    NOT NULL,
    audit_retention    interval    NOT NULL,
    -- rows deleted per table
    deleted            jsonb       NOT NULL DEFAULT '{}',
    started_at         timestamptz NOT NULL DEFAULT now(),
    finished_at        timestamptz
);
CREATE INDEX prune_runs_finished ON prune_runs (finished_at) WHERE finished_at IS NOT NULL;
-- the age columns the prune deletes by, where they had no index
CREATE INDEX event_conflicts_recorded_at ON event_conflicts (recorded_at);
CREATE INDEX outbox_audit_at ON outbox_audit (at);

-- +goose Down
DROP INDEX outbox_audit_at;
DROP INDEX event_conflicts_recorded_at;
DROP TABLE prune_runs;
