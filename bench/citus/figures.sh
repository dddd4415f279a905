#!/usr/bin/env bash
# Per-node figures of the coordinator on a Citus cluster: a coordinator node
# and two workers on this machine (ports 5500-5502, PostgreSQL 15 with Citus
# from `bash .ci/citus`, durable settings: fsync, synchronous_commit and
# full_page_writes on), one server, and idempotency-bench against it. For
# each run it prints the benchmark's report, then per node: commits, WAL
# bytes and CPU time (every process of that PostgreSQL) per operation, and
# the share of the run's records each worker holds.
#
#   cargo build --release --bins
#   bash bench/citus/figures.sh [direct|via-coordinator ...] [-- bench args]
#
# BIN_DIR (default target/release) is where the two programs are taken from.
#
# Modes alternate in the order given (default: direct via-coordinator):
# `direct` is the server's default (calls straight to the worker holding
# their key), `via-coordinator` runs it with --citus-via-coordinator, and
# `plain` runs it on a plain PostgreSQL 15 of the script's own (port 5503,
# the same settings, no Citus), measured the same way as a node, for
# comparison. The bench args
# default to `--scenario cycle --clients 32 --seconds 10`.
set -euo pipefail
cd "$(dirname "$0")/../.."

modes=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do modes+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
[ ${#modes[@]} -gt 0 ] || modes=(direct via-coordinator)
bench_args=("$@")
[ ${#bench_args[@]} -gt 0 ] || bench_args=(--scenario cycle --clients 32 --seconds 10)

bin=/usr/lib/postgresql/15/bin
programs=${BIN_DIR:-target/release}
ports=(5500 5501 5502)
root=$(mktemp -d /tmp/citus-figures.XXXXXX)
chmod 0777 "$root"
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u nobody -- "$@"; else "$@"; fi; }
sql() { psql -h 127.0.0.1 -p "$1" -U postgres -d "$2" -v ON_ERROR_STOP=1 -qAt -c "$3"; }

server=
stop_all() {
    [ -n "$server" ] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null || true
    for port in "${ports[@]}" 5503; do
        as_pg "$bin/pg_ctl" --pgdata "$root/node-$port" --mode=immediate stop >/dev/null 2>&1 || true
    done
    rm -rf "$root"
}
trap stop_all EXIT

plain_port=5503
for port in "${ports[@]}" "$plain_port"; do
    data="$root/node-$port"
    as_pg "$bin/initdb" --pgdata "$data" --username=postgres --auth=trust --locale=C >/dev/null
    cat >> "$data/postgresql.conf" <<EOF
port = $port
listen_addresses = '127.0.0.1'
unix_socket_directories = '$data'
shared_preload_libraries = '$([ "$port" = "$plain_port" ] || echo citus)'
max_prepared_transactions = 100
max_connections = 200
shared_buffers = 256MB
citus.node_conninfo = 'sslmode=disable'
EOF
    as_pg "$bin/pg_ctl" --pgdata "$data" --log "$data/postgres.log" --wait start >/dev/null
    sql "$port" postgres "CREATE DATABASE bench"
    [ "$port" = "$plain_port" ] || sql "$port" bench "CREATE EXTENSION citus"
done
sql 5500 bench "SELECT citus_set_coordinator_host('127.0.0.1', 5500)" >/dev/null
for port in 5501 5502; do
    sql 5500 bench "SELECT citus_add_node('127.0.0.1', $port)" >/dev/null
done
url=postgres://postgres@127.0.0.1:5500/bench
"$programs/idempotency-coordinator" migrate --database-url "$url" >/dev/null 2>&1
"$programs/idempotency-coordinator" migrate --database-url "postgres://postgres@127.0.0.1:$plain_port/bench" >/dev/null 2>&1

# CPU ticks of one node: its postmaster, its live processes, and the ones
# that exited (added to the postmaster's children's times when reaped).
ticks() {
    local pm total=0
    pm=$(head -n 1 "$root/node-$1/postmaster.pid")
    total=$(awk '{print $14+$15+$16+$17}' "/proc/$pm/stat")
    for child in $(pgrep -P "$pm"); do
        total=$((total + $(awk '{print $14+$15}' "/proc/$child/stat" 2>/dev/null || echo 0)))
    done
    echo "$total"
}
wal() { sql "$1" bench "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint"; }
xacts() {
    sql "$1" bench "SELECT pg_stat_clear_snapshot(); SELECT xact_commit FROM pg_stat_database WHERE datname = 'bench'" | tail -n 1
}
snap() {
    for port in "${ports[@]}"; do
        echo "$port $(ticks "$port") $(sql "$port" bench "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint")"
    done
}
commits() {
    for port in "${ports[@]}"; do
        echo "$port $(sql "$port" bench "SELECT pg_stat_clear_snapshot(); SELECT xact_commit FROM pg_stat_database WHERE datname = 'bench'" | tail -n 1)"
    done
}
records() {
    sql 5500 bench "SELECT n.nodeport, sum(r.result::bigint) FROM run_command_on_shards('idempotency_keys', \$\$SELECT count(*) FROM %s\$\$) r JOIN pg_dist_placement p USING (shardid) JOIN pg_dist_node n USING (groupid) GROUP BY 1 ORDER BY 1"
}

hz=$(getconf CLK_TCK)
plain=postgres://postgres@127.0.0.1:$plain_port/bench
for mode in "${modes[@]}"; do
    extra=()
    [ "$mode" = via-coordinator ] && extra=(--citus-via-coordinator)
    log="$root/server-$mode.log"
    if [ "$mode" = plain ]; then
        "$programs/idempotency-coordinator" serve --database-url "$plain" \
            --listen 127.0.0.1:50151 --metrics-listen 127.0.0.1:9564 >"$log" 2>&1 &
        server=$!
        for _ in $(seq 1 100); do grep -q "listening for changes; ready" "$log" && break; sleep 0.1; done
        sql "$plain_port" bench "TRUNCATE idempotency_keys" >/dev/null
        t0=$(ticks "$plain_port"); w0=$(wal "$plain_port"); k0=$(xacts "$plain_port")
        out=$("$programs/idempotency-bench" --target 127.0.0.1:50151 --server-pid "$server" \
            --metrics 127.0.0.1:9564 "${bench_args[@]}")
        t1=$(ticks "$plain_port"); w1=$(wal "$plain_port")
        kill "$server"; wait "$server" 2>/dev/null || true; server=
        sleep 11
        k1=$(xacts "$plain_port")
        ops=$(sql "$plain_port" bench "SELECT count(*) FROM idempotency_keys")
        echo "== plain PostgreSQL: ${bench_args[*]}"
        echo "$out"
        echo "records created: $ops (one per cycle)"
        awk -v ops="$ops" -v hz="$hz" -v t="$((t1 - t0))" -v w="$((w1 - w0))" -v k="$((k1 - k0))" \
            'BEGIN { printf "plain PostgreSQL: %.3f commits, %.0f WAL bytes, %.0f us CPU per cycle\n",
                     k / ops, w / ops, t * 1e6 / hz / ops }'
        continue
    fi
    "$programs/idempotency-coordinator" serve --database-url "$url" \
        --listen 127.0.0.1:50151 --metrics-listen 127.0.0.1:9564 "${extra[@]}" >"$log" 2>&1 &
    server=$!
    for _ in $(seq 1 100); do grep -q "listening for changes; ready" "$log" && break; sleep 0.1; done
    sql 5500 bench "TRUNCATE idempotency_keys" >/dev/null
    c0=$(commits); s0=$(snap)
    out=$("$programs/idempotency-bench" --target 127.0.0.1:50151 --server-pid "$server" \
        --metrics 127.0.0.1:9564 "${bench_args[@]}")
    s1=$(snap)
    kill "$server"; wait "$server" 2>/dev/null || true; server=
    # Backends report their commits to the statistics within 10 s of idling.
    sleep 11
    c1=$(commits)
    ops=$(sql 5500 bench "SELECT count(*) FROM idempotency_keys")
    echo "== $mode: ${bench_args[*]}"
    echo "$out"
    echo "records created: $ops (one per cycle)"
    paste <(echo "$s0") <(echo "$s1") <(echo "$c0") <(echo "$c1") | awk -v ops="$ops" -v hz="$hz" '
        { printf "node %s: %.3f commits, %.0f WAL bytes, %.0f us CPU per record\n",
              $1, ($10 - $8) / ops, ($6 - $3) / ops, ($5 - $2) * 1e6 / hz / ops }'
    # A worker decides the cycles of the records it holds: its CPU per
    # record it holds is its CPU per cycle it decides.
    cpu=$(paste <(echo "$s0") <(echo "$s1") | awk -v hz="$hz" '{ print $1, ($5 - $2) * 1e6 / hz }')
    records | awk -F'|' -v ops="$ops" -v cpu="$cpu" '
        BEGIN { n = split(cpu, c, /[ \n]/); for (i = 1; i < n; i += 2) us[c[i]] = c[i + 1] }
        { printf "node %s holds %.1f%% of the records: %.0f us CPU per cycle it decides\n",
              $1, 100 * $2 / ops, us[$1] / $2 }'
done
