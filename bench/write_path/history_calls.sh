#!/usr/bin/env bash
# bench/write_path/history_calls.sh [ROUNDS]: the probe's layouts B and F (probe.py) under
# concurrency, in SQL on a scratch PostgreSQL 15 server (port 5498): $CL clients (default 16)
# each claiming 64 rows (FOR UPDATE SKIP LOCKED, a claim row per call) and finishing them in
# the same transaction, for 20 s a run, from 1,000,000 ready rows. B moves each finished row to
# a history row of its own; F writes one history row per call (its rows as arrays, a GiST
# index of the call's id range). Runs alternate B and F ROUNDS times (default 2) and print
# jobs a second (rows gone from the queue over the 20 s) and row writes and WAL bytes a job
# (the sends, made before each run, not counted). No pgqueue needed.
set -euo pipefail
rounds=${1:-2} CL=${CL:-16}
B=/usr/lib/postgresql/15/bin
D=/tmp/hc-data
sudo -u postgres $B/pg_ctl -D $D -m fast stop >/dev/null 2>&1 || true
sudo -u postgres rm -rf $D
sudo -u postgres $B/initdb -D $D >/dev/null
cat <<CONF | sudo -u postgres tee -a $D/postgresql.conf >/dev/null
port = 5498
shared_buffers = '512MB'
max_wal_size = '4GB'
unix_socket_directories = '/tmp'
CONF
sudo -u postgres $B/pg_ctl -D $D -l /tmp/hc-server.log -w start >/dev/null
P="sudo -u postgres $B/psql -h /tmp -p 5498 -U postgres -qAt -v ON_ERROR_STOP=1"
$P <<'SQL'
CREATE SCHEMA proto;
CREATE TABLE proto.messages (
    msg_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, queue text NOT NULL,
    priority smallint NOT NULL DEFAULT 0, attempt integer NOT NULL DEFAULT 0, payload jsonb NOT NULL,
    headers jsonb, enqueued_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ON proto.messages (queue, priority DESC, msg_id);
CREATE TABLE proto.claims (
    claim_id bigint GENERATED ALWAYS AS IDENTITY, msg_ids bigint[] NOT NULL, tokens uuid[] NOT NULL,
    lease_expires_at timestamptz NOT NULL
);
CREATE TABLE proto.history (
    msg_id bigint NOT NULL, queue text NOT NULL, outcome text NOT NULL, priority smallint NOT NULL,
    attempt integer NOT NULL, payload jsonb NOT NULL, headers jsonb, enqueued_at timestamptz NOT NULL,
    finished_at timestamptz NOT NULL DEFAULT now(), last_error text
);
CREATE INDEX ON proto.history USING brin (msg_id);
CREATE TABLE proto.history_calls (
    first_id bigint NOT NULL, last_id bigint NOT NULL, msg_ids bigint[] NOT NULL, queue text NOT NULL,
    outcome text NOT NULL, priorities smallint[] NOT NULL, attempts integer[] NOT NULL, payloads jsonb[] NOT NULL,
    headers jsonb[], enqueued_ats timestamptz[] NOT NULL, finished_at timestamptz NOT NULL DEFAULT now(),
    last_errors text[]
);
CREATE INDEX ON proto.history_calls USING gist (int8range(first_id, last_id, '[]'));
SQL
# Both layouts claim alike: the picked rows, locked; the call's claim row; the rows deleted.
claim="WITH picked AS (SELECT msg_id FROM proto.messages WHERE queue = 'probe'
                 ORDER BY priority DESC, msg_id LIMIT 64 FOR UPDATE SKIP LOCKED),
     claimed AS (INSERT INTO proto.claims (msg_ids, tokens, lease_expires_at)
                 SELECT array_agg(msg_id), array_agg(gen_random_uuid()), now() + '30 s' FROM picked
                 HAVING count(*) > 0),
     gone AS (DELETE FROM proto.messages m USING picked p WHERE m.msg_id = p.msg_id RETURNING m.*)"
cat > /tmp/hc-B.sql <<SQL
$claim
INSERT INTO proto.history (msg_id, queue, outcome, priority, attempt, payload, headers, enqueued_at)
SELECT msg_id, queue, 'completed', priority, attempt + 1, payload, headers, enqueued_at FROM gone;
SQL
cat > /tmp/hc-F.sql <<SQL
$claim
INSERT INTO proto.history_calls (first_id, last_id, msg_ids, queue, outcome, priorities, attempts, payloads,
                                 headers, enqueued_ats)
SELECT min(msg_id), max(msg_id), array_agg(msg_id ORDER BY msg_id), min(queue), 'completed',
       array_agg(priority ORDER BY msg_id), array_agg(attempt + 1 ORDER BY msg_id), array_agg(payload ORDER BY msg_id),
       array_agg(headers ORDER BY msg_id), array_agg(enqueued_at ORDER BY msg_id)
  FROM gone HAVING count(*) > 0;
SQL
chmod 644 /tmp/hc-B.sql /tmp/hc-F.sql
echo "| round | layout | jobs/s | row writes / job | WAL bytes / job |"
echo "|---|---|---|---|---|"
for r in $(seq "$rounds"); do
    for layout in B F; do
        $P -c "TRUNCATE proto.messages, proto.claims, proto.history, proto.history_calls" \
           -c "INSERT INTO proto.messages (queue, payload)
               SELECT 'probe', '{\"task\": \"resize\", \"image\": 12345, \"size\": [640, 480]}'
                 FROM generate_series(1, 1000000)" \
           -c "VACUUM ANALYZE" -c "CHECKPOINT"
        before=$($P -c "SELECT pg_stat_force_next_flush()" -c "SELECT pg_current_wal_lsn() || ' ' ||
                   (SELECT sum(n_tup_ins + n_tup_upd + n_tup_del) FROM pg_stat_user_tables WHERE schemaname = 'proto')
                   || ' ' || (SELECT count(*) FROM proto.messages)" | tail -n 1)
        sudo -u postgres $B/pgbench -h /tmp -p 5498 -U postgres -n -c "$CL" -j 2 -T 20 -f /tmp/hc-$layout.sql postgres \
            >/tmp/hc-pgbench.txt 2>&1
        after=$($P -c "SELECT pg_stat_force_next_flush()" -c "SELECT pg_current_wal_lsn() || ' ' ||
                  (SELECT sum(n_tup_ins + n_tup_upd + n_tup_del) FROM pg_stat_user_tables WHERE schemaname = 'proto')
                  || ' ' || (SELECT count(*) FROM proto.messages)" | tail -n 1)
        read -r lsn0 w0 left0 <<<"$before"
        read -r lsn1 w1 left1 <<<"$after"
        jobs=$((left0 - left1))
        wal=$($P -c "SELECT pg_wal_lsn_diff('$lsn1', '$lsn0')")
        awk -v r="$r" -v l="$layout" -v w="$((w1 - w0))" -v j="$jobs" -v wal="$wal" \
            'BEGIN { printf "| %s | %s | %.0f | %.2f | %.0f |\n", r, l, j / 20, w / j, wal / j }'
    done
done
sudo -u postgres $B/pg_ctl -D $D -m fast stop >/dev/null
