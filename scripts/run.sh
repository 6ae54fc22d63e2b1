#!/usr/bin/env bash
# Starts a throwaway PostgreSQL with pgqueue preloaded, creates the extension, runs a short
# demo, and leaves the server running for you to explore.
#   bash scripts/run.sh             # PostgreSQL 17
#   PG=15 bash scripts/run.sh       # or 15 / 18
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here/.."
bash scripts/setup.sh
# shellcheck source=scripts/env.sh
source scripts/env.sh

major="${PG:-17}"
pg_config="$(pg_config_for "$major")"
bindir="$("$pg_config" --bindir)"
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "building and installing pgqueue into PostgreSQL $major"
bash scripts/install.sh --pg-config "$pg_config" 2>&1 | { grep -Ev '^\s*(Compiling|Checking)' || true; }

# A data directory owned by the postgres user (the server refuses to run as root).
datadir="$(mktemp -d /tmp/pgqueue-run.XXXX)"
chown postgres: "$datadir"
chmod 700 "$datadir"
as_pg() { sudo -u postgres "$@"; }

port=54329
while (: >"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do port=$((port + 1)); done

say "starting PostgreSQL $major in $datadir on port $port"
as_pg "$bindir/initdb" -D "$datadir/data" -A trust -U postgres --no-instructions >/dev/null
cat >>"$datadir/data/postgresql.conf" <<CONF
port = $port
listen_addresses = '127.0.0.1'
unix_socket_directories = '$datadir'
shared_preload_libraries = 'pgqueue'
pgqueue.launcher_naptime = '1s'   # default 10s: how soon a new CREATE EXTENSION gets its worker
CONF
as_pg "$bindir/pg_ctl" -D "$datadir/data" -l "$datadir/server.log" -w start >/dev/null
psql_cmd=(sudo -u postgres "$bindir/psql" -h "$datadir" -p "$port" -d postgres -X -v ON_ERROR_STOP=1)

say "CREATE EXTENSION pgqueue"
"${psql_cmd[@]}" -c "CREATE EXTENSION pgqueue" -c "\dx pgqueue"

say "its heartbeat (committed every tick): waiting for two ticks"
for _ in $(seq 1 50); do
    ticks=$("${psql_cmd[@]}" -Atc "SELECT ticks FROM pgqueue.worker_state")
    [ "${ticks:-0}" -ge 2 ] && break
    sleep 0.2
done
"${psql_cmd[@]}" -c "SELECT pid, started_at::time(0), last_tick_at::time(0), ticks, tick_interval_ms FROM pgqueue.worker_state"

say "the background worker, as pg_stat_activity shows it"
"${psql_cmd[@]}" -c "SELECT pid, backend_type, datname, backend_start::time(0) FROM pg_stat_activity WHERE backend_type LIKE 'pgqueue%'"

say "a producer and a consumer"
"${psql_cmd[@]}" <<'SQL'
\set QUIET on
SELECT pgqueue.pgq_create_queue('demo', lease => '2 s', max_attempts => 3);
SELECT pgqueue.pgq_send_batch('demo', ARRAY['{"job": 1}', '{"job": 2}', '{"job": 3}', '{"job": 4}']::jsonb[]);
SELECT pgqueue.pgq_send('demo', '{"job": "urgent"}', priority => 10::smallint);
SELECT pgqueue.pgq_send('demo', '{"job": "later"}', delay => '1 hour');
\set QUIET off
\echo '-- producer: 6 messages sent (one urgent, one delayed by an hour)'
SELECT queue, ready, delayed, claimed FROM pgqueue.queue_stats;
\echo '-- consumer: claims 3 (urgent first), acks two, nacks one for a retry'
CREATE TEMP TABLE held AS SELECT * FROM pgqueue.pgq_claim('demo', qty => 3, consumer => 'demo-consumer');
SELECT msg_id, attempt, priority, payload, lease_expires_at::time(0) FROM held;
SELECT pgqueue.pgq_ack(msg_id, claim_token) AS acked FROM held ORDER BY priority DESC, msg_id LIMIT 2;
SELECT pgqueue.pgq_nack(msg_id, claim_token, retry_in => '0 s', error => 'demo retry') AS nacked
  FROM held ORDER BY priority DESC, msg_id OFFSET 2;
SELECT queue, ready, delayed, claimed FROM pgqueue.queue_stats;
SQL

say "a consumer crashes while holding a message; the worker re-arms it by itself"
# The consumer claims with session_bound => true, then hangs; its connection is killed.
"${psql_cmd[@]}" -Atc \
    "SELECT 'claimed ' || msg_id FROM pgqueue.pgq_claim('demo', lease => '5 min', consumer => 'doomed', session_bound => true)" \
    -c "SELECT pg_sleep(600)" 2>/dev/null &
sleep 1
"${psql_cmd[@]}" -c "SELECT msg_id, state, consumer, lease_expires_at::time(0) AS lease_until FROM pgqueue.messages WHERE consumer = 'doomed'"
echo "killing the consumer's connection..."
"${psql_cmd[@]}" -Atc "SELECT pg_terminate_backend(session_pid) FROM pgqueue.messages WHERE consumer = 'doomed'" >/dev/null
start=$(date +%s.%N)
for _ in $(seq 1 100); do
    left=$("${psql_cmd[@]}" -Atc "SELECT count(*) FROM pgqueue.messages WHERE consumer = 'doomed'")
    [ "$left" = 0 ] && break
    sleep 0.1
done
[ "$left" = 0 ] || { echo "the worker did not re-arm the message; see $datadir/server.log" >&2; exit 1; }
printf 'message claimable again after %.1f s (its lease had 5 minutes left)\n' "$(echo "$(date +%s.%N) - $start" | awk '{print $1 - $3}')"
"${psql_cmd[@]}" -c "SELECT msg_id, state, attempt, last_error FROM pgqueue.messages ORDER BY msg_id"
"${psql_cmd[@]}" -c "SELECT ticks, rearmed, orphans_expired, promoted, tick_failures, since_last_tick FROM pgqueue.worker_stats"
wait 2>/dev/null || true

say "the operator console (docs/console.md)"
cargo build -p pgqueue-console --quiet
console_port=8080
while (: >"/dev/tcp/127.0.0.1/$console_port") 2>/dev/null; do console_port=$((console_port + 1)); done
# Loopback only, so it needs no password; it runs until stopped, like the server.
nohup "$CARGO_TARGET_DIR/debug/pgqueue-console" --listen "127.0.0.1:$console_port" \
    --dsn "host=127.0.0.1 port=$port user=postgres dbname=postgres" >"$datadir/console.log" 2>&1 &
echo $! >"$datadir/console.pid"
for _ in $(seq 1 50); do
    curl -fsS -o /dev/null "http://127.0.0.1:$console_port/" 2>/dev/null && break
    sleep 0.2
done
curl -fsS -o /dev/null "http://127.0.0.1:$console_port/" || { echo "the console did not start; see $datadir/console.log" >&2; exit 1; }

say "pgqueue is running"
cat <<TXT
  console:  http://127.0.0.1:$console_port/   (log: $datadir/console.log)
  connect:  sudo -u postgres $bindir/psql -h $datadir -p $port postgres
            (or: psql "host=127.0.0.1 port=$port user=postgres dbname=postgres")
  log:      $datadir/server.log
  stop:     kill \$(cat $datadir/console.pid); sudo -u postgres $bindir/pg_ctl -D $datadir/data stop && rm -rf $datadir
TXT
