# Sourced by bench/wal's scripts: a private PostgreSQL in a scratch
# directory (initdb, default settings, fsync on) on $port, with the
# settings in $settings (-c name=value …), stopped and removed on exit, and
# a tree's schema and functions loaded into it. Defines bin, data, as_owner
# (a command as the cluster's owner: user postgres when run as root),
# psql_db and load_sql.
#
# Needs PostgreSQL's server binaries (pg_config --bindir, or
# /usr/lib/postgresql/15/bin).
bin=$(pg_config --bindir 2>/dev/null || echo /usr/lib/postgresql/15/bin)
data=$(mktemp -d /tmp/wal-bench.XXXXXX)
as_owner() {
    if [ "$(id -u)" = 0 ]; then su postgres -s /bin/bash -c "$*"; else bash -c "$*"; fi
}
[ "$(id -u)" = 0 ] && chown postgres "$data"
as_owner "'$bin/initdb' -D '$data/db' -A trust -U postgres >/dev/null"
as_owner "'$bin/pg_ctl' -D '$data/db' -o '-p $port -k /tmp -c listen_addresses=127.0.0.1 ${settings:-}' -l '$data/log' -w start >/dev/null"
trap 'as_owner "\"$bin/pg_ctl\" -D \"$data/db\" -m immediate stop" >/dev/null 2>&1 || true; rm -rf "$data"' EXIT
psql_db() { psql "postgres://postgres@127.0.0.1:$port/postgres" -q -At -v ON_ERROR_STOP=1 "$@"; }
# The migrations and functions of the tree at $1 (its sql/), then the
# scripts named after it.
load_sql() {
    local tree=$1
    shift
    for f in "$tree"/sql/migrations/*.sql "$tree"/sql/functions/*.sql "$@"; do
        psql_db -f "$f" >/dev/null
    done
}
