#!/usr/bin/env bash
# bench/write_path/pgbench_claimack.sh PKGDIR LABEL: claim + ack of one message in one statement,
# pgbench for 20 s at $CL clients (default 16), on a scratch PostgreSQL 15 server (port 5499)
# with 150,000 ready messages; the package PKGDIR (a `cargo pgrx package` output) is copied
# over the system's PostgreSQL 15 first. PRE="shared_preload_libraries = 'pgqueue'" preloads
# it; without PRE the server does not. Prints pgbench's tps and the database's held set.
pkg=$1; label=$2; PRE=${PRE:-}; CL=${CL:-16}
B=/usr/lib/postgresql/15/bin
cp -a $pkg/usr/. /usr/ || exit 1
D=/tmp/np-data
sudo -u postgres $B/pg_ctl -D $D -m fast stop >/dev/null 2>&1
sudo -u postgres rm -rf $D
sudo -u postgres $B/initdb -D $D >/dev/null
cat <<CONF | sudo -u postgres tee -a $D/postgresql.conf >/dev/null
port = 5499
shared_buffers = '512MB'
max_connections = 100
synchronous_commit = on
unix_socket_directories = '/tmp'
$PRE
CONF
sudo -u postgres $B/pg_ctl -D $D -l /tmp/np-$label.log -w start >/dev/null
P="$B/psql -h /tmp -p 5499 -U postgres -qAt"
sudo -u postgres $P -c "CREATE EXTENSION pgqueue" -c "SELECT pgqueue.pgq_create_queue('q', lease => '1 hour')" >/dev/null
for i in $(seq 15); do sudo -u postgres $P -c "SELECT count(*) FROM pgqueue.pgq_send_batch('q', (SELECT array_agg(jsonb_build_object('i', g)) FROM generate_series(1,10000) g))" >/dev/null; done
cat > /tmp/np-claimack.sql <<'SQL'
SELECT pgqueue.pgq_ack(c.msg_id, c.claim_token) FROM pgqueue.pgq_claim('q', 1) c;
SQL
chmod 644 /tmp/np-claimack.sql
sudo -u postgres $P -c "VACUUM ANALYZE"
sudo -u postgres $B/pgbench -h /tmp -p 5499 -U postgres -n -c $CL -j 2 -T 20 -f /tmp/np-claimack.sql postgres 2>&1 | grep -E "tps|failed|latency average|processed" 
sudo -u postgres $P -c "SELECT * FROM pgqueue.held_set" 
sudo -u postgres $P -c "SELECT extversion FROM pg_extension WHERE extname='pgqueue'"
sudo -u postgres $B/pg_ctl -D $D -m fast stop >/dev/null
