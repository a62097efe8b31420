-- +goose Up
-- ledger_identity names this ledger. Its id is part of the ledger's epoch
-- (store.Epoch), with which every Redis fast-path entry is tagged: an entry
-- written for another ledger (a database dropped and recreated, restored
-- into a new database, failed over to a promoted standby) is never taken
-- for "already processed" here. After restoring the database from a
-- snapshot of its own volume, give the ledger a new identity by hand:
--   UPDATE ledger_identity SET id = gen_random_uuid();
CREATE TABLE ledger_identity (
    singleton  boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    id         uuid        NOT NULL DEFAULT gen_random_uuid(),
    created_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO ledger_identity DEFAULT VALUES;

-- +goose Down
DROP TABLE ledger_identity;
