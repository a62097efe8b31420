-- +goose Up
-- dlq_audit is the trail of what operators did to messages in events.dlq:
-- who, when, what, and how it ended. eventsctl and the admin API write it.
-- A discard is recorded here (with the message itself) and committed before
-- the message is acked away from the DLQ, so a discarded message can always
-- be recovered from this table. A replay is recorded as 'pending' before its
-- copy is published and updated once the broker confirmed it; a row left
-- 'pending' means the operator's process died in between (the message is then
-- still in the DLQ, or replayed, or both).
CREATE TABLE dlq_audit (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at         timestamptz NOT NULL DEFAULT now(),
    -- operator identity as configured or given (eventsctl --operator,
    -- ADMIN_OPERATOR, or the name given at the admin page's login).
    operator   text        NOT NULL,
    -- cli, api or web; client is the host or remote address it came from.
    via        text        NOT NULL,
    client     text        NOT NULL DEFAULT '',
    action     text        NOT NULL CHECK (action IN ('replay', 'discard')),
    dry_run    boolean     NOT NULL DEFAULT false,
    -- x-ie-dlq-id of the message (or its derived id), its event and why it
    -- was in the DLQ.
    dlq_id     text        NOT NULL,
    event_id   text        NOT NULL DEFAULT '',
    event_type text        NOT NULL DEFAULT '',
    reason     text        NOT NULL DEFAULT '',
    -- pending, replayed, discarded, would_replay, would_discard, failed.
    outcome    text        NOT NULL,
    detail     text        NOT NULL DEFAULT '',
    -- discards keep the message (body, and headers plus AMQP properties), so
    -- nothing an operator throws away is lost.
    payload    bytea,
    properties jsonb,
    updated_at timestamptz
);
CREATE INDEX dlq_audit_at_idx ON dlq_audit (at);
CREATE INDEX dlq_audit_dlq_id_idx ON dlq_audit (dlq_id);
CREATE INDEX dlq_audit_event_id_idx ON dlq_audit (event_id) WHERE event_id <> '';

-- +goose Down
DROP TABLE dlq_audit;
