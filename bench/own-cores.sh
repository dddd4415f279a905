#!/usr/bin/env bash
# `cycle ÷ limit` with the clients on a core of their own: idempotency-bench
# (and the pgbench its `limit` starts) on the last core, PostgreSQL and the
# coordinator on the others. On a shared machine the clients take CPU from
# the system they measure, and a gRPC client costs more per call than
# pgbench; in production the callers run elsewhere. Each round runs
# `cycle,limit` twice, once pinned and once with every process free to use
# every core, so that the two ratios come from the same minutes.
#
#   bash bench/own-cores.sh                       # 3 rounds, 32 clients, 10 s
#   ROUNDS=6 SECS=10 CLIENTS=32 bash bench/own-cores.sh
#   SERVER=/path/to/idempotency-coordinator bash bench/own-cores.sh
#   CHECK=1.3 bash bench/own-cores.sh             # exit 1 if the pinned
#                                                 # median ratio is lower
#
# Needs `cargo build --release` (the benchmark, and the server unless
# SERVER names one), two cores or more, and the PostgreSQL at DATABASE_URL
# running on this machine, whose processes it pins with taskset: run it as
# root or as PostgreSQL's own user. While it runs, every database of that
# PostgreSQL runs on the pinned cores; it gives them every core back when
# it ends. It creates a database of its own and drops it after. The server
# sizes its worker threads by the cores it may use (one on two cores).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
server=${SERVER:-$root/target/release/idempotency-coordinator}
bench=$root/target/release/idempotency-bench
rounds=${ROUNDS:-3}
seconds=${SECS:-10}
clients=${CLIENTS:-32}
port=${PORT:-50081}
metrics_port=$((port + 1))
url=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}
db=own_cores_$$
db_url=${url%/*}/$db
work=$(mktemp -d)
export PGOPTIONS="-c client_min_messages=warning"

cores=$(nproc --all)
if [ "$cores" -lt 2 ]; then
    echo "needs two cores or more; this machine has $cores" >&2
    exit 1
fi
last=$((cores - 1))
clients_core=$last
system_cores=0
[ "$last" -gt 1 ] && system_cores=0-$((last - 1))
every_core=0-$last

# PostgreSQL's processes: the postmaster (whose affinity new backends
# inherit), named by its data directory's postmaster.pid, and those it
# started.
data_dir=$(psql -qXAt "$url" -c "SELECT current_setting('data_directory')")
postmaster=$(head -1 "$data_dir/postmaster.pid" 2>/dev/null || true)
if [ -z "$postmaster" ] || ! kill -0 "$postmaster" 2>/dev/null; then
    echo "cannot find PostgreSQL's postmaster on this machine (data directory $data_dir)" >&2
    exit 1
fi
pin_postgres() {
    for p in $postmaster $(pgrep -P "$postmaster"); do
        taskset -apc "$1" "$p" >/dev/null
    done
}

cleanup() {
    if [ -n "${pid:-}" ]; then
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    fi
    pin_postgres "$every_core" || true
    psql -qX "$url" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

# One `cycle,limit` on a fresh database; $1 is how: `pinned` or `shared`.
run() {
    local server_cores=$every_core bench_cores=$every_core
    if [ "$1" = pinned ]; then
        server_cores=$system_cores
        bench_cores=$clients_core
    fi
    pin_postgres "$server_cores"
    psql -qX "$url" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db" >/dev/null
    RUST_LOG=info taskset -c "$server_cores" "$server" serve --database-url "$db_url" \
        --listen "127.0.0.1:$port" --metrics-listen "127.0.0.1:$metrics_port" \
        >"$work/server.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 300); do
        grep -q "listening for changes" "$work/server.log" && break
        kill -0 "$pid" 2>/dev/null || { cat "$work/server.log" >&2; exit 1; }
        sleep 0.1
    done
    grep -q "listening for changes" "$work/server.log" || { echo "the server did not start" >&2; exit 1; }
    taskset -c "$bench_cores" "$bench" --target "127.0.0.1:$port" --server-pid "$pid" \
        --metrics "127.0.0.1:$metrics_port" --database-url "$db_url" \
        --scenario cycle,limit --clients "$clients" --seconds "$seconds" >"$work/bench.log"
    kill -INT "$pid"
    wait "$pid" 2>/dev/null || true
    pid=
    local cycle limit
    cycle=$(awk '/^RESULT scenario=cycle /' "$work/bench.log")
    limit=$(awk '/^RESULT scenario=limit /' "$work/bench.log")
    field() { tr ' ' '\n' <<<"$1" | awk -F= -v k="$2" '$1 == k { print $2 }'; }
    local ratio
    ratio=$(awk -v c="$(field "$cycle" ops_per_s)" -v l="$(field "$limit" ops_per_s)" 'BEGIN { printf "%.2f", c / l }')
    echo "$ratio" >>"$work/$1.ratios"
    printf '%-7s cycle %6s/s  limit %6s/s  ratio %s  PostgreSQL per cycle %s µs (limit %s)  server %s µs  commits %s\n' \
        "$1" "$(field "$cycle" ops_per_s)" "$(field "$limit" ops_per_s)" "$ratio" \
        "$(field "$cycle" postgres_cpu_us)" "$(field "$limit" postgres_cpu_us)" \
        "$(field "$cycle" server_cpu_us)" "$(field "$cycle" commits)"
}

echo "clients on core $clients_core; PostgreSQL and the server on $system_cores when pinned"
for round in $(seq 1 "$rounds"); do
    echo "round $round"
    run shared
    run pinned
done

median() { sort -n "$work/$1.ratios" | awk '{ r[NR] = $1 } END { printf "%.2f", NR % 2 ? r[(NR + 1) / 2] : (r[NR / 2] + r[NR / 2 + 1]) / 2 }'; }
echo "cycle ÷ limit, median of $rounds: shared $(median shared), pinned $(median pinned)"
if [ -n "${CHECK:-}" ] && awk -v m="$(median pinned)" -v b="$CHECK" 'BEGIN { exit !(m < b) }'; then
    echo "missed: the pinned median is below $CHECK" >&2
    exit 1
fi
