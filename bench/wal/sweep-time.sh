#!/usr/bin/env bash
# How long the sweeper takes to remove expired records from a large table:
# RECORDS records (2,000,000 by default), EXPIRED of them (100,000) past
# expires_at and spread through the table, the rest SUCCEEDED and live for
# a day; then the background sweeper's batches (idempotency_sweep_batch,
# BATCH rows each, exclusive, each its own transaction) until one removes
# nothing. Prints the wall time and the backend's CPU time of the sweeping
# alone, and checks that exactly the expired records went. Each run on a
# private PostgreSQL (bench/wal/cluster.sh), so alternate two trees with
# SQL_FROM to compare:
#
#   bash bench/wal/sweep-time.sh
#   SQL_FROM=/path/to/older/checkout bash bench/wal/sweep-time.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
records=${RECORDS:-2000000}
expired=${EXPIRED:-100000}
batch=${BATCH:-1000}
port=${PORT:-5539}
for setting in "RECORDS=$records" "EXPIRED=$expired" "BATCH=$batch"; do
    [[ ${setting#*=} =~ ^[1-9][0-9]*$ ]] || { echo "$setting: a positive whole number, please" >&2; exit 2; }
done
settings="-c autovacuum=off -c max_wal_size=8GB -c checkpoint_timeout=1d"
# shellcheck source=bench/wal/cluster.sh
. "$here/cluster.sh"
load_sql "${SQL_FROM:-$root}"
# Every (records / expired)-th record expired a minute to a day ago, the
# others SUCCEEDED and live for a day.
psql_db -c "SET synchronous_commit = off" -c "
    INSERT INTO idempotency_keys (
        tenant, scope, idempotency_key, status, fingerprint, attempt_count, max_attempts,
        retention, lease_token, lease_request_id, lease_outcome, result, completed_at,
        created_at, updated_at, expires_at)
    SELECT 'tenant', 'payments', md5(g::text), 'SUCCEEDED', repeat('f', 64), 1, 3,
           interval '1 day', gen_random_uuid(), '', 'SUCCESS', '\\x7b7d', now(),
           now(), now(),
           CASE WHEN g % ($records / $expired) = 0 AND g / ($records / $expired) <= $expired
                THEN now() - (1 + g % 1440) * interval '1 minute'
                ELSE now() + interval '1 day' END
      FROM generate_series(1, $records) g"
psql_db -c "VACUUM ANALYZE idempotency_keys"
psql_db -c "CHECKPOINT"
read -r seconds cpu_ms deleted <<<"$(psql_db -F ' ' <<SQL
SELECT clock_timestamp() AS t0,
       split_part(pg_read_file('/proc/self/schedstat'), ' ', 1)::bigint AS cpu0 \gset
CREATE TEMP TABLE swept (n bigint);
DO \$\$
DECLARE n bigint;
BEGIN
    LOOP
        SELECT expired_deleted INTO n FROM idempotency_sweep_batch(NULL, $batch, false, true, 0);
        INSERT INTO swept VALUES (n);
        COMMIT;
        EXIT WHEN n = 0;
    END LOOP;
END \$\$;
SELECT round(extract(epoch FROM clock_timestamp() - :'t0')::numeric, 2),
       round((split_part(pg_read_file('/proc/self/schedstat'), ' ', 1)::bigint - :cpu0) / 1e6, 0),
       (SELECT sum(n) FROM swept);
SQL
)"
left=$(psql_db -c "SELECT count(*) FILTER (WHERE expires_at <= now()) || ' expired of ' || count(*) FROM idempotency_keys")
echo "removed $deleted of $expired expired records from $records in batches of $batch: $seconds s, $cpu_ms ms of the backend's CPU (left: $left)"
