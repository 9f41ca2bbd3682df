-- nous_sched's state store (PostgresStateStore): versioned keys of JSON text, per scope.
-- Applied once, in one transaction, by the first store to open the database
-- (nous_sched/_postgres_client.py); its number is kept in nous_sched_schema.
-- A scope's row in nous_sched_state_scopes is its write lock (SELECT ... FOR UPDATE)
-- and its version counter: a version is never given twice in one scope.

CREATE TABLE nous_sched_state_scopes (
    scope   TEXT PRIMARY KEY,
    counter BIGINT NOT NULL
);

CREATE TABLE nous_sched_state (
    scope   TEXT NOT NULL,
    key     TEXT NOT NULL,
    value   TEXT NOT NULL,
    version BIGINT NOT NULL,
    PRIMARY KEY (scope, key)
);
