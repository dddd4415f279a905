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
# shellcheck source=bench/wal/cluster.sh
. "$here/cluster.sh"
procedure=wal_cycles
scripts="$here/cycles.sql"
if [ -n "${MIXED:-}" ]; then procedure=wal_cycles_mixed; scripts="$scripts $here/mixed.sql"; fi
# shellcheck disable=SC2086 # one word a script
load_sql "${SQL_FROM:-$root}" $scripts
psql_db -c "CALL $procedure($((batch * 100)), $batch, 'warm')"
as_owner "'$bin/pg_ctl' -D '$data/db' -w stop >/dev/null"
echo "CALL $procedure($cycles, $batch, 'run');" |
    as_owner "cd '$data' && valgrind --tool=callgrind --callgrind-out-file='$data/cg.out' \
        --collect-atstart=no --toggle-collect=ExecuteCallStmt \
        '$bin/postgres' --single -D '$data/db' postgres" >/dev/null 2>"$data/valgrind.log"
total=$(awk '/^(summary|totals):/ { print $2; exit }' "$data/cg.out")
[ -n "${KEEP:-}" ] && cp "$data/cg.out" "$KEEP"
echo "$cycles cycles in batches of $batch through $procedure: $(awk -v t="$total" -v n="$cycles" 'BEGIN{printf "%.0f", t/n}') instructions per cycle"
