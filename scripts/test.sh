#!/usr/bin/env bash
# Runs every test (pg_test unit tests and the integration tests in tests/) on
# PostgreSQL 15, 17 and 18, prints a per-version summary, and fails if anything failed.
#   bash scripts/test.sh            # all three majors
#   bash scripts/test.sh 17         # just one
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here/.."
bash scripts/setup.sh || exit 1
# shellcheck source=scripts/env.sh
source scripts/env.sh

# pgrx's harness installs the extension before it starts a test cluster: through our
# installer, which replaces files atomically (a server already running keeps working).
export CARGO_PGRX="$here/install.sh"

versions=("$@")
((${#versions[@]})) || versions=(15 17 18)

logdir=$(mktemp -d /tmp/pgqueue-test-logs.XXXX)
declare -A passed failed status
total_passed=0 total_failed=0 rc=0

# The console's own tests (units and its binary; no server): once, not per major. Its
# browser tests run with the others, in tests/clients/console.rs.
echo "=== the console's unit tests ==="
console=ok
if ! cargo test -p pgqueue-console --quiet 2>&1 | tee "$logdir/console.log"; then console=FAILED rc=1; fi
for v in "${versions[@]}"; do
    echo "=== PostgreSQL $v ==="
    pgdata="/tmp/pgqueue-test-pg$v-$$"
    log="$logdir/pg$v.log"
    # postgres refuses to run as root: the servers run as the postgres user.
    cargo pgrx test "pg$v" --runas postgres --pgdata "$pgdata" 2>&1 | tee "$log"
    status[$v]=${PIPESTATUS[0]}
    sudo -u postgres rm -rf "$pgdata" 2>/dev/null || rm -rf "$pgdata"
    p=$(awk '/^test result:/ { for (i = 1; i < NF; i++) if ($(i+1) ~ /^passed/) s += $i } END { print s + 0 }' "$log")
    f=$(awk '/^test result:/ { for (i = 1; i < NF; i++) if ($(i+1) ~ /^failed/) s += $i } END { print s + 0 }' "$log")
    passed[$v]=${p:-0} failed[$v]=${f:-0}
    total_passed=$((total_passed + passed[$v])) total_failed=$((total_failed + failed[$v]))
    if [ "${status[$v]}" != 0 ] || [ "${passed[$v]}" = 0 ]; then rc=1; fi
done

echo
echo "=== summary (logs in $logdir) ==="
for v in "${versions[@]}"; do
    verdict=ok; [ "${status[$v]}" != 0 ] && verdict="FAILED (exit ${status[$v]})"
    [ "${passed[$v]}" = 0 ] && verdict="FAILED (no test ran)"
    printf 'PostgreSQL %s: %3d passed, %d failed  %s\n' "$v" "${passed[$v]}" "${failed[$v]}" "$verdict"
done
echo "console unit tests: $console"
echo "total: $total_passed passed, $total_failed failed"
exit $rc
