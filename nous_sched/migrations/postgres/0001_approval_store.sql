-- nous_sched's approval store (PostgresApprovalStore): its key and its suspensions.
-- Applied once, in one transaction, by the first store to open the database
-- (nous_sched/_postgres_client.py); its number is kept in nous_sched_schema.
-- Every text column holds ASCII JSON or seals (NUL and any other character
-- reach it as a JSON escape), so what was sealed is read back byte for byte.

CREATE TABLE nous_sched_meta (
    name  TEXT PRIMARY KEY,
    value BYTEA NOT NULL
);

CREATE TABLE nous_sched_suspensions (
    id            TEXT PRIMARY KEY,
    record        TEXT NOT NULL,
    expires       DOUBLE PRECISION NOT NULL,
    state         TEXT NOT NULL,
    decisions     TEXT NOT NULL DEFAULT '{}',
    claimed_by    TEXT NOT NULL DEFAULT '',
    seal          TEXT NOT NULL DEFAULT '',
    state_seal    TEXT NOT NULL DEFAULT '',
    progress      TEXT NOT NULL DEFAULT '',
    progress_seal TEXT NOT NULL DEFAULT ''
);

CREATE INDEX nous_sched_suspensions_expires ON nous_sched_suspensions (expires);
