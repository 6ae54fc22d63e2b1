#!/usr/bin/env bash
# Runs the benchmarks (bench/) against a throwaway server of PostgreSQL $PG (default 17),
# built without assertions, with a release build of pgqueue preloaded.
#   bash scripts/bench.sh                                  # every scenario, full sizes
#   PG=15 bash scripts/bench.sh --scenarios flatness       # one scenario on another major
#   bash scripts/bench.sh --smoke                          # tiny sizes
#   bash scripts/bench.sh --huge-pages ...                 # shared buffers in 2 MB pages
# Results (a table on stdout, results.json, PNG charts) go to bench-results/pg$PG/.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here/.."
bash scripts/setup.sh --bench
# shellcheck source=scripts/env.sh
source scripts/env.sh

major="${PG:-17}"
if [ "$major" = 15 ]; then
    pg_config="$PG15_CONFIG" # Debian's build: no assertions
else
    pg_config="$PGQUEUE_CACHE/pg$major-release/bin/pg_config"
fi
# Bindings for the benchmark builds differ from the test builds': keep their artifacts apart.
export CARGO_TARGET_DIR="$PGQUEUE_CACHE/target-bench"
echo "[bench] installing a release build of pgqueue into $("$pg_config" --version)"
bash scripts/install.sh --pg-config "$pg_config" 2>&1 | tail -n 1
# --huge-pages: the kernel must have the pages reserved (1 GB of shared buffers and the rest
# of the server's shared memory fit in 600 of 2 MB).
for arg in "$@"; do
    if [ "$arg" = --huge-pages ]; then
        have="$(awk '/^HugePages_Total:/ { print $2 }' /proc/meminfo)"
        if [ "${have:-0}" -lt 600 ]; then
            echo "[bench] reserving 600 huge pages (vm.nr_hugepages)"
            sudo sysctl -q -w vm.nr_hugepages=600
        fi
    fi
done
cargo run --quiet --release -p pgqueue-bench -- --pg-config "$pg_config" --out "bench-results/pg$major" "$@"
