-- pgqueue 0.7.0 -> 0.8.0: the hot paths in Rust. pgq_claim, pgq_ack_claim and the internal
-- pgqueue._to_history (which ack, nack and fail use) become C-language functions running
-- statements prepared once per process; same names, arguments, results and errors.
-- Definitions as in sql/claim.sql and sql/finish.sql of 0.8.0.

CREATE OR REPLACE FUNCTION pgqueue._to_history(msg_ids bigint[], claim_tokens uuid[], outcome text, error text DEFAULT NULL)
RETURNS SETOF bigint
LANGUAGE c VOLATILE AS 'MODULE_PATHNAME', '_to_history_wrapper';

CREATE OR REPLACE FUNCTION pgqueue.pgq_claim(
    queue text,
    qty integer DEFAULT 1,
    lease interval DEFAULT NULL,
    consumer text DEFAULT NULL,
    session_bound boolean DEFAULT false,
    wait interval DEFAULT '0'
) RETURNS TABLE (
    msg_id bigint,
    claim_token uuid,
    attempt integer,
    priority smallint,
    payload jsonb,
    headers jsonb,
    enqueued_at timestamptz,
    lease_expires_at timestamptz
)
LANGUAGE c VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET enable_indexscan = on SET enable_bitmapscan = off SET enable_sort = off SET jit = off
AS 'MODULE_PATHNAME', 'pgq_claim_wrapper';

CREATE OR REPLACE FUNCTION pgqueue.pgq_ack_claim(
    queue text,
    ack_msg_ids bigint[],
    ack_claim_tokens uuid[],
    qty integer DEFAULT 1,
    lease interval DEFAULT NULL,
    consumer text DEFAULT NULL,
    session_bound boolean DEFAULT false,
    wait interval DEFAULT '0'
) RETURNS TABLE (
    kind text,
    msg_id bigint,
    claim_token uuid,
    attempt integer,
    priority smallint,
    payload jsonb,
    headers jsonb,
    enqueued_at timestamptz,
    lease_expires_at timestamptz
)
LANGUAGE c VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET enable_indexscan = on SET enable_bitmapscan = off SET enable_sort = off SET jit = off
AS 'MODULE_PATHNAME', 'pgq_ack_claim_wrapper';
