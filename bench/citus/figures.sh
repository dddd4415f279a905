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
#   bash bench/citus/figures.sh [direct|via-coordinator|plain ...] [-- bench args]
#
# BIN_DIR (default target/release) is where the two programs are taken from.
# SHARD_COUNT sets the distributed table's shards (Citus's default, 32), and
# EXTRA_SQL names a file of SQL run on the coordinator node after the
# migration (a change to the functions tried without a new build).
#
# Modes alternate in the order given (default: direct via-coordinator):
# `direct` is the server's default (calls straight to the worker holding
# their key), `via-coordinator` runs it with --citus-via-coordinator, and
# `plain` runs it on a plain PostgreSQL 15 of the script's own (port 5503,
# the same settings, no Citus), measured the same way as a node, for
# comparison. The bench args default to
# `--scenario cycle --clients 32 --seconds 10` (one scenario a run).
#
# Everything printed also goes to bench/results/DATE-citus.txt (or OUT),
# (APPEND=1: added to it, so that runs of several scenarios make one file)
# after `# date:`, `# commit:`, `# machine:`, `# load:` and `# postgresql:`
# headers, with `RESULT` lines .ci/figures reads for docs/scaling.md:
# - the benchmark's own, its scenario named after the mode
#   (`scenario=direct-cycle ...`);
# - per run, `scenario=MODE-SCENARIO-nodes`: `cpu_us` the PostgreSQL CPU
#   per operation of the node(s) that decide (plain: the one server; Citus:
#   both workers' CPU over the records they hold, so per cycle a worker
#   decides), `commits` and `wal_bytes` per operation summed over every
#   node, `all_cpu_us` every node's CPU per operation, the coordinator
#   node's included;
# - per `direct` run followed by a `plain` one (or the reverse),
#   `scenario=SCENARIO-direct-over-plain`: `cpu_ratio` (the worker's CPU
#   per operation it decides over plain PostgreSQL's) and `capacity_2`
#   (two workers' projected capacity over one plain primary's, cores ÷ CPU
#   per operation decided: 2 × plain ÷ worker).
# An operation is a record created for `cycle` (one per cycle), else one
# of the operations the benchmark counted (ops/s × seconds).
set -euo pipefail
cd "$(dirname "$0")/../.."

modes=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do modes+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
[ ${#modes[@]} -gt 0 ] || modes=(direct via-coordinator)
bench_args=("$@")
[ ${#bench_args[@]} -gt 0 ] || bench_args=(--scenario cycle --clients 32 --seconds 10)
scenario=cycle seconds=10
for ((i = 0; i + 1 < ${#bench_args[@]}; i++)); do
    case "${bench_args[$i]}" in
        --scenario) scenario=${bench_args[$((i + 1))]} ;;
        --seconds) seconds=${bench_args[$((i + 1))]} ;;
    esac
done
results=${OUT:-bench/results/$(date -u +%F)-citus.txt}
mkdir -p "$(dirname "$results")"
if [ -n "${APPEND:-}" ]; then exec > >(tee -a "$results"); else exec > >(tee "$results"); fi

programs=${BIN_DIR:-target/release}
PLAIN_PORT=5503
# shellcheck source=bench/citus/cluster.sh
. bench/citus/cluster.sh

server=
stop_all() {
    [ -n "$server" ] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null || true
    citus_cluster_stop
}
trap stop_all EXIT
citus_cluster_start
url=postgres://postgres@127.0.0.1:5500/bench
"$programs/idempotency-coordinator" migrate --database-url "$url" >/dev/null 2>&1
"$programs/idempotency-coordinator" migrate --database-url "postgres://postgres@127.0.0.1:$plain_port/bench" >/dev/null 2>&1
[ -z "${EXTRA_SQL:-}" ] || psql -h 127.0.0.1 -p 5500 -U postgres -d bench -v ON_ERROR_STOP=1 -q -f "$EXTRA_SQL"

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
echo "# date: $(date -u +%FT%TZ)"
echo "# commit: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src sql bench || echo ' (with changes)')"
echo "# machine: $(nproc) cores, $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1), $(free -g | awk '/^Mem:/ { print $2 }') GiB"
echo "# load: $(cut -d' ' -f1-3 /proc/loadavg) (1, 5, 15 min) before the first run"
echo "# postgresql: $(sql "$plain_port" bench 'SHOW server_version'), citus $(sql 5500 bench "SELECT extversion FROM pg_extension WHERE extname = 'citus'")"
echo "# command: bash bench/citus/figures.sh ${modes[*]} -- ${bench_args[*]}"

# The operations a run's CPU is divided by: records created for a cycle
# (one per cycle; $1 the port to count them on), else the benchmark's.
operations() {
    if [ "$scenario" = cycle ]; then
        sql "$1" bench "SELECT count(*) FROM idempotency_keys"
    else
        sed -n 's/^RESULT .* ops_per_s=\([0-9.]*\).*/\1/p' <<<"$2" | head -n 1 | awk -v s="$seconds" '{ printf "%.0f", $1 * s }'
    fi
}
# The benchmark's report, its RESULT lines named after the mode.
report() { sed "s/^RESULT scenario=/RESULT scenario=$1-/" <<<"$2"; }

# The deciding CPU per operation of each run, in order: "mode value".
decided=()
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
        ops=$(operations "$plain_port" "$out")
        echo "== plain PostgreSQL: ${bench_args[*]}"
        report plain "$out"
        echo "operations: $ops"
        line=$(awk -v ops="$ops" -v hz="$hz" -v t="$((t1 - t0))" -v w="$((w1 - w0))" -v k="$((k1 - k0))" \
            'BEGIN { printf "%.0f %.3f %.0f", t * 1e6 / hz / ops, k / ops, w / ops }')
        read -r cpu commits walb <<<"$line"
        echo "plain PostgreSQL: $commits commits, $walb WAL bytes, $cpu us CPU per operation"
        echo "RESULT scenario=plain-$scenario-nodes cpu_us=$cpu all_cpu_us=$cpu commits=$commits wal_bytes=$walb"
        decided+=("plain $cpu")
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
    ops=$(operations 5500 "$out")
    echo "== $mode: ${bench_args[*]}"
    report "$mode" "$out"
    echo "operations: $ops"
    nodes=$(paste <(echo "$s0") <(echo "$s1") <(echo "$c0") <(echo "$c1"))
    awk -v ops="$ops" -v hz="$hz" '
        { printf "node %s: %.3f commits, %.0f WAL bytes, %.0f us CPU per operation\n",
              $1, ($10 - $8) / ops, ($6 - $3) / ops, ($5 - $2) * 1e6 / hz / ops }' <<<"$nodes"
    # A worker decides the cycles of the records it holds: its CPU per
    # record it holds is its CPU per cycle it decides. Other scenarios
    # create no records: each worker's share is half.
    held=$(records)
    [ "$scenario" = cycle ] || held=$(printf '5501|%s\n5502|%s\n' "$((ops / 2))" "$((ops - ops / 2))")
    cpu=$(awk -v hz="$hz" '{ print $1, ($5 - $2) * 1e6 / hz }' <<<"$nodes")
    awk -F'|' -v ops="$ops" -v cpu="$cpu" '
        BEGIN { n = split(cpu, c, /[ \n]/); for (i = 1; i < n; i += 2) us[c[i]] = c[i + 1] }
        { printf "node %s holds %.1f%% of the operations: %.0f us CPU per operation it decides\n",
              $1, 100 * $2 / ops, us[$1] / $2 }' <<<"$held"
    line=$(awk -F'|' -v ops="$ops" -v cpu="$cpu" -v nodes="$nodes" '
        BEGIN { n = split(cpu, c, /[ \n]/); for (i = 1; i < n; i += 2) us[c[i]] = c[i + 1]
                m = split(nodes, l, "\n")
                for (i = 1; i <= m; i++) { split(l[i], f, /[ \t]+/); k += f[10] - f[8]; w += f[6] - f[3] } }
        { worker += us[$1]; held += $2 }
        END { all = 0; for (p in us) all += us[p]
              printf "%.0f %.0f %.3f %.0f", worker / held, all / ops, k / ops, w / ops }' <<<"$held")
    read -r wcpu acpu commits walb <<<"$line"
    echo "RESULT scenario=$mode-$scenario-nodes cpu_us=$wcpu all_cpu_us=$acpu commits=$commits wal_bytes=$walb"
    decided+=("$mode $wcpu")
done

# Each direct run beside the plain run next to it (runs alternate).
for ((i = 0; i + 1 < ${#decided[@]}; i++)); do
    read -r m1 v1 <<<"${decided[$i]}"
    read -r m2 v2 <<<"${decided[$((i + 1))]}"
    case "$m1 $m2" in
        "direct plain") w=$v1 p=$v2 ;;
        "plain direct") w=$v2 p=$v1 ;;
        *) continue ;;
    esac
    awk -v w="$w" -v p="$p" -v s="$scenario" 'BEGIN {
        printf "%s: a worker spends %.2fx plain PostgreSQL CPU per operation it decides (%d us over %d); two workers hold %.2fx one plain primary (2 x %d / %d)\n",
               s, w / p, w, p, 2 * p / w, p, w
        printf "RESULT scenario=%s-direct-over-plain cpu_ratio=%.2f capacity_2=%.2f\n", s, w / p, 2 * p / w }'
    i=$((i + 1))
done
