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
cargo pgrx install --release --sudo --pg-config "$pg_config" --no-default-features --features "pg$major" 2>&1 |
    grep -Ev '^\s*(Compiling|Checking)' || true

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
pgqueue.database = 'postgres'
CONF
as_pg "$bindir/pg_ctl" -D "$datadir/data" -l "$datadir/server.log" -w start >/dev/null
psql_cmd=(sudo -u postgres "$bindir/psql" -h "$datadir" -p "$port" -d postgres -X -v ON_ERROR_STOP=1)

say "CREATE EXTENSION pgqueue"
"${psql_cmd[@]}" -c "CREATE EXTENSION pgqueue" -c "\dx pgqueue"

say "the background worker, as pg_stat_activity shows it"
"${psql_cmd[@]}" -c "SELECT pid, backend_type, datname, backend_start::time(0) FROM pg_stat_activity WHERE backend_type = 'pgqueue worker'"

say "its heartbeat (committed every tick): waiting for two ticks"
for _ in $(seq 1 50); do
    ticks=$("${psql_cmd[@]}" -Atc "SELECT ticks FROM pgqueue.worker_state")
    [ "${ticks:-0}" -ge 2 ] && break
    sleep 0.2
done
"${psql_cmd[@]}" -c "SELECT pid, started_at::time(0), last_tick_at::time(0), ticks, tick_interval_ms FROM pgqueue.worker_state"

say "pgqueue is running"
cat <<TXT
  connect:  sudo -u postgres $bindir/psql -h $datadir -p $port postgres
            (or: psql "host=127.0.0.1 port=$port user=postgres dbname=postgres")
  log:      $datadir/server.log
  stop:     sudo -u postgres $bindir/pg_ctl -D $datadir/data stop && rm -rf $datadir
TXT
