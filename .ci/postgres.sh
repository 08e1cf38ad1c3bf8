#!/usr/bin/env bash
# Start a throwaway PostgreSQL server for the session-store tests.
#
# Installs Debian's postgresql when it is missing, starts a server on 127.0.0.1 on a free
# port with its data in a new temporary directory, creates a database, and prints one line
# for the caller to eval:
#
#     eval "$(.ci/postgres.sh)"    # sets LITTLEGHOST_TEST_POSTGRES_DSN
#
# Everything else goes to stderr. Runs as root (the server runs as the postgres user) or
# as an ordinary user that can run initdb. Set LITTLEGHOST_TEST_POSTGRES_PORT to choose
# the port.
set -euo pipefail

log() { printf '%s\n' "$*" >&2; }

find_bin() {
    ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1
}

bin="$(find_bin)"
if [ -z "$bin" ] || [ ! -x "$bin/initdb" ]; then
    log "postgres.sh: installing Debian's postgresql"
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -qq >&2
    $sudo apt-get install -y -qq --no-install-recommends postgresql >&2
    bin="$(find_bin)"
fi

port="${LITTLEGHOST_TEST_POSTGRES_PORT:-}"
if [ -z "$port" ]; then
    port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')"
fi

root="$(mktemp -d "${TMPDIR:-/tmp}/littleghost-postgres.XXXXXX")"
as_owner=()
if [ "$(id -u)" -eq 0 ]; then
    chown postgres:postgres "$root"
    as_owner=(runuser -u postgres --)
fi
chmod 700 "$root"

"${as_owner[@]}" "$bin/initdb" --pgdata="$root/data" --username=postgres --auth=trust \
    --encoding=UTF8 --locale=C.UTF-8 --no-sync >"$root/initdb.log" 2>&1 \
    || { cat "$root/initdb.log" >&2; exit 1; }
# Throwaway data: no fsync. Room for the 50-session concurrency tests.
"${as_owner[@]}" "$bin/pg_ctl" --pgdata="$root/data" --log="$root/server.log" --wait \
    --options="-c listen_addresses=127.0.0.1 -c port=$port -c unix_socket_directories=$root -c max_connections=300 -c fsync=off -c synchronous_commit=off -c full_page_writes=off" \
    start >&2 || { cat "$root/server.log" >&2; exit 1; }
"${as_owner[@]}" "$bin/createdb" --host=127.0.0.1 --port="$port" --username=postgres littleghost_test >&2

log "postgres.sh: PostgreSQL $("$bin/postgres" --version | awk '{print $3}') on 127.0.0.1:$port (data in $root)"
printf "export LITTLEGHOST_TEST_POSTGRES_DSN='postgresql://postgres@127.0.0.1:%s/littleghost_test'\n" "$port"
printf "# stop it with: %s %s/pg_ctl --pgdata=%s/data stop\n" "${as_owner[*]}" "$bin" "$root"
