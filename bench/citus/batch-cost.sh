#!/usr/bin/env bash
# What a Citus worker spends on a node's share of a batch, by the routed
# batch's own body: bench/citus/batch-cost.sql run in one session on a
# worker, so that the figure holds no server, network, commit wait of
# other sessions or scheduling. Steadier than bench/citus/figures.sh's
# whole-node CPU, which drifts by a fifth between runs here; it does not
# replace it (the top-level statement, the protocol and the commits of a
# real run are left out, and one session meets no lock).
#
#   cargo build --release --bins
#   bash bench/citus/batch-cost.sh [LABEL[:SQL_FILE] ...]
#
# Each LABEL gets a database of its own on one cluster (bench/citus/
# cluster.sh), migrated by BIN_DIR's idempotency-coordinator (default
# target/release), then SQL_FILE run on the coordinator node if given (a
# change to the functions tried without a new build). The labels' runs
# alternate, ROUNDS times (default 3); each run warms its session up with
# 100 batches (every shard's statements prepared), then measures BATCHES
# batches (default 1000) of BATCH Acquires and BATCH Completes (default 4,
# about what a worker gets at 32 clients). SHARD_COUNT as in
# bench/citus/figures.sh. Prints per run:
#   RESULT label=LABEL round=N batch=B cpu_us_per_cycle=.. wall_us_per_cycle=..
set -euo pipefail
cd "$(dirname "$0")/../.."
programs=${BIN_DIR:-target/release}
labels=("$@")
[ ${#labels[@]} -gt 0 ] || labels=(tree)
# shellcheck source=bench/citus/cluster.sh
. bench/citus/cluster.sh
trap citus_cluster_stop EXIT
citus_cluster_start
for label_sql in "${labels[@]}"; do
    label=${label_sql%%:*}
    extra=${label_sql#"$label"}; extra=${extra#:}
    [[ $label =~ ^[a-z0-9_]+$ ]] || { echo "$label: a label is lower-case letters, digits and _" >&2; exit 2; }
    db=cost_$label
    citus_database "$db"
    "$programs/idempotency-coordinator" migrate --database-url "postgres://postgres@127.0.0.1:5500/$db" >/dev/null 2>&1
    [ -z "$extra" ] || psql -h 127.0.0.1 -p 5500 -U postgres -d "$db" -v ON_ERROR_STOP=1 -q -f "$extra"
    psql -h 127.0.0.1 -p 5500 -U postgres -d "$db" -v ON_ERROR_STOP=1 -q -f bench/citus/batch-cost.sql
done
batch=${BATCH:-4}
for round in $(seq "${ROUNDS:-3}"); do
    for label_sql in "${labels[@]}"; do
        label=${label_sql%%:*}
        figures=$(psql -h 127.0.0.1 -p 5501 -U postgres -d "cost_$label" -v ON_ERROR_STOP=1 -qAt \
            -c "CALL batch_cost_cycles(100, $batch, 'warm$round')" \
            -c "CALL batch_cost_cycles(${BATCHES:-1000}, $batch, 'run$round')" 2>&1 \
            | sed -n 's/.*NOTICE: *\(cpu_us_per_cycle=.*\)/\1/p' | tail -n 1)
        [ -n "$figures" ] || { echo "$label: the run failed" >&2; exit 1; }
        echo "RESULT label=$label round=$round batch=$batch $figures"
    done
done
