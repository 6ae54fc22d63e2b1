#!/usr/bin/env bash
# Idempotent toolchain setup for pgqueue on Debian 12 (root):
#   Debian packages, cargo-pgrx 0.18.1, PostgreSQL 17/18 built from Debian's
#   checksummed source tarballs into a cache outside the clone, `cargo pgrx init`.
# A second run rebuilds nothing.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=scripts/env.sh
source "$here/env.sh"

log() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }

# --- Debian packages ---------------------------------------------------------
debs=(sudo bison flex libclang-dev clang pkg-config make gcc libreadline-dev zlib1g-dev
      libssl-dev libicu-dev ca-certificates curl bzip2 fonts-dejavu-core postgresql-15 postgresql-server-dev-15
      # clients, examples and what they are tested with (clients/, examples/, monitoring/)
      python3 python3-venv golang-go golang-github-lib-pq-dev pgbouncer prometheus-postgres-exporter prometheus
      # the console's browser tests drive Debian's Chromium (console/tests)
      chromium
      # the failover test (tests/failover.rs): a Patroni cluster over one etcd, started by the test
      etcd-server patroni)
missing=()
for p in "${debs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
    log "installing Debian packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    # The Debian package starts a cluster we do not use; keep the machine quiet.
    if command -v pg_ctlcluster >/dev/null && [ -d /etc/postgresql/15/main ]; then
        pg_ctlcluster 15 main stop 2>/dev/null || true
    fi
    # Likewise the services of the packages the tests start on ports of their own.
    for service in pgbouncer prometheus-postgres-exporter prometheus etcd patroni; do
        service "$service" stop >/dev/null 2>&1 || true
    done
fi
# Node.js and npm for the Node example: Debian's, unless the machine already has both.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    log "installing Node.js and npm"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
fi

# --- cargo-pgrx --------------------------------------------------------------
if [ "$(cargo pgrx --version 2>/dev/null | awk '{print $2}')" != "$PGRX_VERSION" ]; then
    log "installing cargo-pgrx $PGRX_VERSION (a few minutes)"
    cargo install cargo-pgrx --version "$PGRX_VERSION" --locked --quiet
fi

# --- PostgreSQL 17 and 18 from Debian source tarballs ------------------------
# The archive is whatever apt is configured with on this machine.
apt_uri() {
    local f uri=""
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        uri=$(awk '/^URIs:/ {print $2; exit}' "$f")
        [ -n "$uri" ] && break
    done
    if [ -z "$uri" ] && [ -f /etc/apt/sources.list ]; then
        uri=$(awk '$1=="deb" && $0 !~ /security/ {print $2; exit}' /etc/apt/sources.list)
    fi
    [ -n "$uri" ] || { echo "no apt archive URI found" >&2; exit 1; }
    echo "${uri%/}"
}

build_pg() { # major version sha256 [flavor]
    # flavor "" : the test build (assertions on); "release": for benchmarks (no assertions).
    local major=$1 version=$2 sha=$3 flavor=${4:-}
    local prefix="$PGQUEUE_CACHE/pg$major${flavor:+-$flavor}"
    local flags="--enable-debug --enable-cassert"
    [ "$flavor" = release ] && flags=""
    if [ -x "$prefix/bin/pg_config" ] && [ "$("$prefix/bin/pg_config" --version)" = "PostgreSQL $version" ]; then
        return
    fi
    local tarball="postgresql-${major}_${version}.orig.tar.bz2"
    local src="$PGQUEUE_CACHE/src"
    mkdir -p "$src"
    if ! echo "$sha  $src/$tarball" | sha256sum -c --status 2>/dev/null; then
        log "downloading $tarball"
        curl -fsSL --retry 3 -o "$src/$tarball.part" "$(apt_uri)/pool/main/p/postgresql-$major/$tarball"
        echo "$sha  $src/$tarball.part" | sha256sum -c --status || { echo "checksum mismatch for $tarball" >&2; exit 1; }
        mv "$src/$tarball.part" "$src/$tarball"
    fi
    log "building PostgreSQL $version into $prefix (about 5 minutes)"
    local build
    build=$(mktemp -d "$src/build-$major.XXXX")
    tar -xjf "$src/$tarball" -C "$build" --strip-components=1
    (
        cd "$build"
        # shellcheck disable=SC2086
        ./configure --prefix="$prefix" --without-icu $flags >"$build/configure.log" 2>&1
        make -j"$(nproc)" world-bin >"$build/make.log" 2>&1
        rm -rf "$prefix"
        make install-world-bin >"$build/install.log" 2>&1
    ) || { echo "PostgreSQL $version build failed; logs in $build" >&2; exit 1; }
    rm -rf "$build"
}

PG17=(17 17.11 dd27f2b3c59e73ed14aa3324901242bf69a032a6347805f274e6260322d42979)
PG18=(18 18.6 555610c24d53e4316da5b7d3fc25c279d96856d5e0e23ee308c328c5fa881d9f)
build_pg "${PG17[@]}"
build_pg "${PG18[@]}"
# `setup.sh --bench`: also builds 17 and 18 without assertions, for benchmarks.
if [ "${1:-}" = --bench ]; then
    build_pg "${PG17[@]}" release
    build_pg "${PG18[@]}" release
fi

# --- cargo pgrx init ---------------------------------------------------------
want="$PGRX_HOME/config.toml"
if ! { [ -f "$want" ] && grep -q "$PG15_CONFIG" "$want" && grep -q "$PGQUEUE_CACHE/pg17" "$want" \
        && grep -q "$PGQUEUE_CACHE/pg18" "$want"; }; then
    log "cargo pgrx init"
    cargo pgrx init --pg15="$PG15_CONFIG" --pg17="$PGQUEUE_CACHE/pg17/bin/pg_config" \
        --pg18="$PGQUEUE_CACHE/pg18/bin/pg_config" >/dev/null
fi

# --- Python: a virtual environment for the Python client's tests --------------
# Holds the client's dependencies (from clients/python/pyproject.toml; the tests run the
# clone's own source on top of it) and the cron reference test's (tests/cron). Re-created
# when either list changes.
pyproject="$here/../clients/python/pyproject.toml"
cron_requirements="$here/../tests/cron/requirements.txt"
if [ -f "$pyproject" ]; then
    stamp="$PGQUEUE_VENV/.pyproject.sha256"
    want_sum=$(cat "$pyproject" "$cron_requirements" | sha256sum | cut -d' ' -f1)
    if [ "$(cat "$stamp" 2>/dev/null)" != "$want_sum" ]; then
        log "Python environment for the client tests ($PGQUEUE_VENV)"
        rm -rf "$PGQUEUE_VENV"
        /usr/bin/python3 -m venv "$PGQUEUE_VENV"
        "$PGQUEUE_VENV/bin/pip" install -q --upgrade pip
        "$PGQUEUE_VENV/bin/pip" install -q "$here/../clients/python[test]" -r "$cron_requirements"
        echo "$want_sum" >"$stamp"
    fi
    # The console's browser tests (console/tests): pytest and Playwright for Python, which
    # drives /usr/bin/chromium; its wheel carries its driver, and no browser is downloaded.
    if ! "$PGQUEUE_VENV/bin/python" -c 'import playwright, pytest' 2>/dev/null; then
        log "Playwright and pytest for the console's browser tests"
        "$PGQUEUE_VENV/bin/pip" install -q playwright pytest
    fi
fi

# --- Node: the Node example's dependencies, for its test ---------------------
# `npm ci` from examples/node's lock into the cache (the clone keeps no node_modules); the
# test points NODE_PATH there. Re-done when package.json or the lock changes.
node_example="$here/../examples/node"
if [ -f "$node_example/package-lock.json" ]; then
    node_modules="$PGQUEUE_CACHE/node-example"
    want_sum=$(cat "$node_example/package.json" "$node_example/package-lock.json" | sha256sum | cut -d' ' -f1)
    if [ "$(cat "$node_modules/.lock.sha256" 2>/dev/null)" != "$want_sum" ]; then
        log "Node example dependencies ($node_modules)"
        rm -rf "$node_modules"
        mkdir -p "$node_modules"
        cp "$node_example/package.json" "$node_example/package-lock.json" "$node_example/.npmrc" "$node_modules/"
        npm ci --prefix "$node_modules" --no-audit --no-fund --loglevel=error >/dev/null
        echo "$want_sum" >"$node_modules/.lock.sha256"
    fi
fi

# The test and run commands install the extension into these trees as root, then the
# postgres user runs the servers; make the build trees readable for it.
log "toolchain ready (cache: $PGQUEUE_CACHE)"
