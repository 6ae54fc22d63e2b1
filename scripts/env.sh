# Shared settings for pgqueue's scripts. Caches live outside the clone so a fresh
# clone on the same machine reuses them, and outside $HOME because the postgres user
# must be able to run the PostgreSQL builds kept there.
export PGQUEUE_CACHE="${PGQUEUE_CACHE:-/var/cache/pgqueue}"
export PGRX_VERSION=0.18.1
export PGRX_HOME="${PGRX_HOME:-$HOME/.pgrx}"
export PG15_CONFIG=/usr/lib/postgresql/15/bin/pg_config
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PGQUEUE_CACHE/target}"
export PATH="$HOME/.cargo/bin:$PATH"
export PGQUEUE_VENV="${PGQUEUE_VENV:-$PGQUEUE_CACHE/venv}"
pg_config_for() { # major -> pg_config path
    case "$1" in
        15) echo "$PG15_CONFIG" ;;
        *) echo "$PGQUEUE_CACHE/pg$1/bin/pg_config" ;;
    esac
}
