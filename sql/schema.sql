-- pgqueue schema. Every table, constraint and index of the extension is defined here.

-- One row: what the background worker last did in this database. The worker updates it
-- every tick, so it doubles as a liveness signal anyone can read.
CREATE TABLE pgqueue.worker_state (
    singleton        boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    pid              integer,
    started_at       timestamptz,
    last_tick_at     timestamptz,
    ticks            bigint NOT NULL DEFAULT 0,
    tick_interval_ms integer
);
INSERT INTO pgqueue.worker_state DEFAULT VALUES;
