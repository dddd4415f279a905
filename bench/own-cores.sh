#!/usr/bin/env bash
# `cycle ÷ limit` with the clients on cores of their own: idempotency-bench
# (and the pgbench its `limit` starts) on the last CLIENT_CORES of the cores
# PostgreSQL may use (1 unless said), PostgreSQL and the coordinator on the
# others. On a shared machine the clients take CPU from the system they
# measure, and a gRPC client costs more per call than pgbench; in
# production the callers run elsewhere. Each round runs `cycle,limit`
# twice, once pinned and once with every process free to use every core,
# so that the two ratios come from the same minutes.
#
#   bash bench/own-cores.sh                       # 3 rounds, 32 clients, 10 s
#   ROUNDS=6 SECS=10 CLIENTS=32 bash bench/own-cores.sh
#   CLIENT_CORES=2 bash bench/own-cores.sh        # on a larger machine, so
#                                                 # that the clients are not
#                                                 # what the pinned run measures
#   SERVER=/path/to/idempotency-coordinator bash bench/own-cores.sh
#   CHECK=1.3 bash bench/own-cores.sh             # exit 1 if the pinned
#                                                 # median ratio is lower
#
# Needs `cargo build --release` (the benchmark, and the server unless
# SERVER names one), two cores or more, and the PostgreSQL at DATABASE_URL
# (postgres://USER@HOST:PORT/DATABASE) running on this machine, whose
# processes it pins with taskset: run it as root or as PostgreSQL's own
# user. While it runs, every database of that PostgreSQL runs on the pinned
# cores; when it ends, they get the postmaster's cores as they were. It
# creates two databases of its own (the server's and the limit's) and
# drops them after. The server sizes its worker threads by the cores it
# may use (one on two cores).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/bench/server.sh"
server=${SERVER:-$root/target/release/idempotency-coordinator}
bench=$root/target/release/idempotency-bench
rounds=${ROUNDS:-3}
seconds=${SECS:-10}
clients=${CLIENTS:-32}
client_cores=${CLIENT_CORES:-1}
port=${PORT:-50081}
metrics_port=$((port + 1))
url=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}
db=own_cores_$$
db_url=${url%/*}/$db
limit_db=own_cores_limit_$$
limit_url=${url%/*}/$limit_db
export PGOPTIONS="-c client_min_messages=warning"

work=$(mktemp -d)
postmaster=
original=
cleanup() {
    stop_server TERM
    if [ -n "$original" ]; then
        pin_postgres "$original" || true
    fi
    psql -qX "$url" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" \
        -c "DROP DATABASE IF EXISTS $limit_db WITH (FORCE)" >/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

# PostgreSQL's processes: the postmaster (whose affinity new backends
# inherit), named by its data directory's postmaster.pid, and those it
# started. One that ends meanwhile (a backend, an autovacuum worker) is
# no longer there to pin.
data_dir=$(psql -qXAt "$url" -c "SELECT current_setting('data_directory')")
postmaster=$(head -1 "$data_dir/postmaster.pid" 2>/dev/null || true)
if [ -z "$postmaster" ] || ! kill -0 "$postmaster" 2>/dev/null; then
    echo "cannot find PostgreSQL's postmaster on this machine (data directory $data_dir)" >&2
    exit 1
fi
pin_postgres() {
    taskset -apc "$1" "$postmaster" >/dev/null
    for p in $(pgrep -P "$postmaster"); do
        taskset -apc "$1" "$p" >/dev/null 2>&1 || ! kill -0 "$p" 2>/dev/null
    done
}

# The cores the postmaster may use now (a list such as 0-3,6), one by one.
original=$(taskset -pc "$postmaster" | sed 's/.*: //')
mapfile -t cores < <(tr ',' '\n' <<<"$original" |
    awk -F- '{ for (c = $1; c <= ($2 == "" ? $1 : $2); c++) print c }')
if [ "${#cores[@]}" -le "$client_cores" ]; then
    echo "needs more than $client_cores cores; PostgreSQL may use ${#cores[@]} ($original)" >&2
    exit 1
fi
split=$((${#cores[@]} - client_cores))
system_cores=$(IFS=,; echo "${cores[*]:0:split}")
clients_cores=$(IFS=,; echo "${cores[*]:split}")

# One `cycle,limit` on a fresh database; $1 is how: `pinned` or `shared`.
run() {
    local server_cores=$original bench_cores=$original
    if [ "$1" = pinned ]; then
        server_cores=$system_cores
        bench_cores=$clients_cores
    fi
    pin_postgres "$server_cores"
    psql -qX "$url" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db" >/dev/null
    start_server "$work/server.log" env RUST_LOG=info taskset -c "$server_cores" "$server" serve \
        --database-url "$db_url" --listen "127.0.0.1:$port" --metrics-listen "127.0.0.1:$metrics_port"
    taskset -c "$bench_cores" "$bench" --target "127.0.0.1:$port" --server-pid "$pid" \
        --metrics "127.0.0.1:$metrics_port" --database-url "$db_url" \
        --limit-database-url "$limit_url" \
        --scenario cycle,limit --clients "$clients" --seconds "$seconds" >"$work/bench.log"
    stop_server INT
    local cycle limit ratio
    cycle=$(awk '/^RESULT scenario=cycle /' "$work/bench.log")
    limit=$(awk '/^RESULT scenario=limit /' "$work/bench.log")
    ratio=$(sed -n 's/^cycle ÷ limit: \([0-9.]*\) .*/\1/p' "$work/bench.log")
    if [ -z "$cycle" ] || [ -z "$limit" ] || [ -z "$ratio" ]; then
        echo "the benchmark reported no cycle, limit or ratio:" >&2
        cat "$work/bench.log" >&2
        exit 1
    fi
    field() { tr ' ' '\n' <<<"$1" | awk -F= -v k="$2" '$1 == k { print $2 }'; }
    echo "$ratio" >>"$work/$1.ratios"
    printf '%-7s cycle %6s/s  limit %6s/s  ratio %s  PostgreSQL per cycle %s µs (limit %s)  server %s µs  commits %s\n' \
        "$1" "$(field "$cycle" ops_per_s)" "$(field "$limit" ops_per_s)" "$ratio" \
        "$(field "$cycle" postgres_cpu_us)" "$(field "$limit" postgres_cpu_us)" \
        "$(field "$cycle" server_cpu_us)" "$(field "$cycle" commits)"
}

echo "clients on cores $clients_cores; PostgreSQL and the server on $system_cores when pinned"
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
