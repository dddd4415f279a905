#!/usr/bin/env bash
# The SQL's cost per cycle in instructions, counted by valgrind's callgrind:
# the same figure on every run of the same tree, whatever else the machine
# is doing, where CPU time drifts by a fifth. Starts a private PostgreSQL,
# loads the tree's schema and functions (sql/) and the cycle procedures,
# warms the table up, then runs the measured cycles in a single-user
# backend under callgrind, counting only inside the CALL.
#
#   bash bench/wal/instructions.sh                 # bench/wal/cycles.sql
#   MIXED=1 bash bench/wal/instructions.sh         # bench/wal/mixed.sql
#   SQL_FROM=/path/to/older/checkout bash bench/wal/instructions.sh
#   KEEP=/tmp/cg.out bash bench/wal/instructions.sh   # keep the profile
#                                                  # (callgrind_annotate)
#
# Needs valgrind and PostgreSQL's server binaries; as root it runs the
# cluster as user postgres. 800 cycles take about 15 seconds.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cycles=${CYCLES:-800}
batch=${BATCH:-16}
port=${PORT:-5529}
bin=$(pg_config --bindir 2>/dev/null || echo /usr/lib/postgresql/15/bin)
data=$(mktemp -d /tmp/wal-instructions.XXXXXX)
as_owner() {
    if [ "$(id -u)" = 0 ]; then su postgres -s /bin/bash -c "$*"; else bash -c "$*"; fi
}
[ "$(id -u)" = 0 ] && chown postgres "$data"
as_owner "'$bin/initdb' -D '$data/db' -A trust -U postgres >/dev/null"
as_owner "'$bin/pg_ctl' -D '$data/db' -o '-p $port -k /tmp -c listen_addresses=127.0.0.1' -l '$data/log' -w start >/dev/null"
trap 'as_owner "\"$bin/pg_ctl\" -D \"$data/db\" -m immediate stop" >/dev/null 2>&1; rm -rf "$data"' EXIT
psql_db() { psql "postgres://postgres@127.0.0.1:$port/postgres" -q -At -v ON_ERROR_STOP=1 "$@"; }
procedure=wal_cycles
scripts="$here/cycles.sql"
if [ -n "${MIXED:-}" ]; then procedure=wal_cycles_mixed; scripts="$scripts $here/mixed.sql"; fi
sql=${SQL_FROM:-$root}/sql
for f in "$sql"/migrations/*.sql "$sql"/functions/*.sql $scripts; do
    psql_db -f "$f" >/dev/null
done
psql_db -c "CALL $procedure($((batch * 100)), $batch, 'warm')"
as_owner "'$bin/pg_ctl' -D '$data/db' -w stop >/dev/null"
echo "CALL $procedure($cycles, $batch, 'run');" |
    as_owner "cd '$data' && valgrind --tool=callgrind --callgrind-out-file='$data/cg.out' \
        --collect-atstart=no --toggle-collect=ExecuteCallStmt \
        '$bin/postgres' --single -D '$data/db' postgres" >/dev/null 2>"$data/valgrind.log"
total=$(awk '/^(summary|totals):/ { print $2; exit }' "$data/cg.out")
[ -n "${KEEP:-}" ] && cp "$data/cg.out" "$KEEP"
echo "$cycles cycles in batches of $batch through $procedure: $(awk -v t="$total" -v n="$cycles" 'BEGIN{printf "%.0f", t/n}') instructions per cycle"
