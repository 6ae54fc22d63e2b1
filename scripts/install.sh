#!/usr/bin/env bash
# Builds pgqueue and installs it into a PostgreSQL installation by atomic replacement: every
# file is written beside its destination and renamed over it, so a running server keeps the
# library it has mapped and a starting backend sees the old file or the new one, never half
# of one. (`cargo pgrx install` copies over the file in place; a running server that has the
# library loaded can then crash.)
#
#   bash scripts/install.sh --pg-config /path/to/pg_config [--debug] [cargo pgrx package flags]
#
# Defaults: a release build with the feature for that server's major. Also installs the
# update scripts (sql/upgrade/) and the full scripts of earlier releases (sql/install/), so
# `ALTER EXTENSION pgqueue UPDATE` finds its path and `CREATE EXTENSION pgqueue VERSION` can
# name one. pgrx's test harness calls it as `CARGO_PGRX` (`install.sh pgrx install …`,
# see scripts/test.sh); any other cargo-pgrx command is passed through.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here/.."
if [ "${1:-}" = pgrx ]; then
    shift
    if [ "${1:-}" != install ]; then
        exec cargo pgrx "$@"
    fi
    shift
    profile=--debug # `cargo pgrx install` builds debug unless told otherwise
else
    profile=
fi

args=() pg_config="" features=0 as_root=()
while (($#)); do
    case "$1" in
        --sudo) ((EUID == 0)) || as_root=(sudo) ;;
        --no-schema) ;; # `cargo pgrx package` always writes the schema
        --release) profile= ;;
        --debug) profile=--debug ;;
        --profile) profile="--profile $2"; shift ;;
        --pg-config | -c) pg_config=$2; args+=("$1" "$2"); shift ;;
        --pg-config=*) pg_config=${1#*=}; args+=("$1") ;;
        --features | -F) features=1; args+=("$1" "$2"); shift ;;
        --features=*) features=1; args+=("$1") ;;
        *) args+=("$1") ;;
    esac
    shift
done
[ -n "$pg_config" ] || { echo "install.sh: --pg-config is required" >&2; exit 2; }
major=$("$pg_config" --version | sed -E 's/^PostgreSQL ([0-9]+).*/\1/')
((features)) || args+=(--no-default-features --features "pg$major")

# One build at a time per target directory: each copies its library out of it.
target="${CARGO_TARGET_DIR:-target}"
mkdir -p "$target"
exec 9>"$target/.pgqueue-install.lock"
flock 9

staging=$(mktemp -d /tmp/pgqueue-package.XXXX)
trap 'rm -rf "$staging"' EXIT
# shellcheck disable=SC2086
cargo pgrx package $profile "${args[@]}" --out-dir "$staging" >&2

extdir="$("$pg_config" --sharedir)/extension"
mkdir -p "$staging$extdir"
cp sql/upgrade/pgqueue--*--*.sql sql/install/pgqueue--*.sql "$staging$extdir/"

# The package mirrors the installation's absolute paths under $staging. The library goes
# first and the control file last, so the SQL never names a library that is not there yet.
(
    cd "$staging"
    find . -type f -name '*.so'
    find . -type f ! -name '*.so' ! -name '*.control'
    find . -type f -name '*.control'
) | while IFS= read -r file; do
    dest="${file#.}"
    "${as_root[@]}" mkdir -p "$(dirname "$dest")"
    "${as_root[@]}" cp "$staging/$file" "$dest.new.$$"
    "${as_root[@]}" chmod a+r "$dest.new.$$"
    "${as_root[@]}" mv -f "$dest.new.$$" "$dest"
    echo "installed $dest" >&2
done
