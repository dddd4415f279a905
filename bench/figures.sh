#!/usr/bin/env bash
# The figures of docs/performance.md's table, measured in one run and kept:
# a release server on a fresh database of its own, then idempotency-bench
# with 32 clients for 10 s a step: `cycle` and `limit` alternated three
# times, `replay`, `contend`, `http-cycle`, then 10,000 waiters. Everything
# the benchmark printed goes to bench/results/DATE-performance.txt (or
# OUT), after a header naming the commit, the machine, PostgreSQL and the
# command; .ci/figures then holds the table to that file, so a figure
# cannot be edited by hand or go stale without the check failing.
#
#   cargo build --release && bash bench/figures.sh
#   SECS=5 OUT=/tmp/figures.txt bash bench/figures.sh   # a quick look
#
# Needs `cargo build --release`, pgbench, and the PostgreSQL at
# DATABASE_URL (postgres://USER@HOST:PORT/DATABASE), where it creates two
# databases (the server's and the limit's) and drops them after. Run it on
# a quiet machine: the figures are what the machine gave in those minutes.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/bench/server.sh"
server=${SERVER:-$root/target/release/idempotency-coordinator}
bench=$root/target/release/idempotency-bench
seconds=${SECS:-10}
clients=${CLIENTS:-32}
port=${PORT:-50091}
metrics_port=$((port + 1))
http_port=$((port + 2))
url=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}
db=figures_$$
db_url=${url%/*}/$db
limit_db=figures_limit_$$
limit_url=${url%/*}/$limit_db
out=${OUT:-$root/bench/results/$(date -u +%F)-performance.txt}
export PGOPTIONS="-c client_min_messages=warning"

work=$(mktemp -d)
cleanup() {
    stop_server TERM
    psql -qX "$url" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" \
        -c "DROP DATABASE IF EXISTS $limit_db WITH (FORCE)" >/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

psql -qX "$url" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db" >/dev/null
start_server "$work/server.log" "$server" serve --database-url "$db_url" --listen "127.0.0.1:$port" \
    --metrics-listen "127.0.0.1:$metrics_port" --http-listen "127.0.0.1:$http_port"

common=(--target "127.0.0.1:$port" --server-pid "$pid" --metrics "127.0.0.1:$metrics_port"
    --database-url "$db_url" --limit-database-url "$limit_url" --clients "$clients")
timed=(--scenario cycle,limit,cycle,limit,cycle,limit,replay,contend,http-cycle
    --http-target "http://127.0.0.1:$http_port" --connections "$clients" --seconds "$seconds")
waiters=(--scenario wait --waiters 10000)
{
    echo "# date: $(date -u +%FT%TZ)"
    echo "# commit: $(git -C "$root" rev-parse --short HEAD)$(git -C "$root" diff --quiet HEAD -- src sql bench || echo ' (with changes)')"
    echo "# machine: $(nproc) cores, $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1), $(free -g | awk '/^Mem:/ { print $2 }') GiB"
    echo "# postgresql: $(psql -qXAt "$url" -c 'SHOW server_version')"
    echo "# command: idempotency-bench ${common[*]} ${timed[*]}"
    "$bench" "${common[@]}" "${timed[@]}"
    echo "# command: idempotency-bench ${common[*]} ${waiters[*]}"
    "$bench" "${common[@]}" "${waiters[@]}"
} >"$work/figures.txt"
mkdir -p "$(dirname "$out")"
mv "$work/figures.txt" "$out"
grep '^RESULT\|^#' "$out"
echo "written to $out"
