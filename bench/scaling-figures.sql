-- Size of the records table and cost of sweeping it, measured on a scratch
-- database (docs/scaling.md quotes the results).
--
--   createdb -h 127.0.0.1 -U postgres scaling_scratch
--   for f in sql/migrations/*.sql sql/functions/*.sql; do
--       psql -h 127.0.0.1 -U postgres -d scaling_scratch -v ON_ERROR_STOP=1 -q -f "$f"
--   done
--   nice -n 19 psql -h 127.0.0.1 -U postgres -d scaling_scratch -v n=100000 \
--       -f bench/scaling-figures.sql
--   dropdb -h 127.0.0.1 -U postgres scaling_scratch
--
-- Needs a superuser (CHECKPOINT, and this backend's CPU time read from
-- /proc/<pid>/stat, so Linux), and psql on the database's host for the
-- renice below (harmless where it fails). WAL is counted per statement by
-- EXPLAIN (ANALYZE, WAL) and, for VACUUM, by its VERBOSE report, so other
-- databases' traffic on the same server does not count.
--
-- Records have the shape idempotency-bench's cycle scenario makes: tenant
-- 'default' (authentication off), scope 'bench.cycle', a 27-28 character
-- key, no fingerprint or request id, the default lease (15 min), attempts
-- (10) and retention (1 day), and on success the 15-byte result
-- {"status":"ok"}, application/json, status 200.

\set ON_ERROR_STOP on
\pset footer off

-- Be gentle to whatever else runs on the machine.
SELECT pg_backend_pid() AS pid \gset
\setenv BACKEND_PID :pid
\! renice -n 19 -p "$BACKEND_PID" >/dev/null 2>&1 || true
SET max_parallel_maintenance_workers = 0;

-- CPU seconds this backend has used (utime + stime, in clock ticks of 10 ms).
CREATE FUNCTION pg_temp.cpu_s() RETURNS numeric LANGUAGE sql AS $$
    SELECT (split_part(s, ' ', 14)::numeric + split_part(s, ' ', 15)::numeric) / 100
      FROM pg_read_file('/proc/' || pg_backend_pid() || '/stat') s
$$;

-- Runs q (in the caller's transaction) and adds the WAL it wrote to step.
CREATE TEMP TABLE wal (step text, bytes numeric, fpi bigint);
CREATE FUNCTION pg_temp.run(step text, q text) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    plan json;
BEGIN
    EXECUTE 'EXPLAIN (ANALYZE, WAL, TIMING off, FORMAT JSON) ' || q INTO plan;
    INSERT INTO wal VALUES (step, (plan -> 0 -> 'Plan' ->> 'WAL Bytes')::numeric,
                                  (plan -> 0 -> 'Plan' ->> 'WAL FPI')::bigint);
END
$$;

CREATE TEMP TABLE figures (step text, records bigint, wall_s numeric, cpu_s numeric);

-- Sizes of the table, its TOAST table and each index, and per million records.
CREATE FUNCTION pg_temp.sizes() RETURNS TABLE (relation text, bytes bigint, per_record numeric, mib_per_million numeric)
LANGUAGE sql AS $$
    WITH n AS (SELECT count(*) AS n FROM idempotency_keys),
    rel AS (
        SELECT 'heap' AS relation, pg_relation_size('idempotency_keys') AS bytes, 1 AS o
        UNION ALL
        SELECT 'toast (+ its index)', coalesce(pg_total_relation_size(reltoastrelid), 0), 2
          FROM pg_class WHERE oid = 'idempotency_keys'::regclass
        UNION ALL
        SELECT 'index ' || i.indexrelid::regclass, pg_relation_size(i.indexrelid), 3
          FROM pg_index i WHERE i.indrelid = 'idempotency_keys'::regclass
        UNION ALL
        SELECT 'total (pg_total_relation_size)', pg_total_relation_size('idempotency_keys'), 4
    )
    SELECT relation, bytes, round(bytes::numeric / n, 1),
           round(bytes::numeric / n * 1000000 / 1048576, 1)
      FROM rel, n ORDER BY o, relation
$$;

\set key '''18c2f0a9b3d4e5f6a7-0-'' || (i % 32) || ''-'' || (i / 32)'
\set acquire 'SELECT count(*) FROM generate_series(%s, %s) i, LATERAL idempotency_acquire(''default'', ''bench.cycle'', %s, '''', '''', 900000, 10, 86400000, 0, 0) a'
\set complete 'SELECT count(*) FROM idempotency_keys k, LATERAL idempotency_complete(k.tenant, k.scope, k.idempotency_key, k.lease_token, ''SUCCESS'', convert_to(''{"status":"ok"}'', ''UTF8''), ''application/json'', 200, '''', '''', false, NULL, 1000, 3600000, 0) c WHERE k.status = ''PROCESSING'''

-- 1. PROCESSING records: n Acquires, in 10 statements of n/10.
TRUNCATE idempotency_keys;
SELECT pg_temp.cpu_s() AS cpu0, clock_timestamp() AS t0 \gset
SELECT format('SELECT pg_temp.run(%L, %L)', 'acquire',
              format(:'acquire', c * :n / 10 + 1, (c + 1) * :n / 10, :'key'))
  FROM generate_series(0, 9) c \gexec
INSERT INTO figures SELECT 'acquire', :n,
    extract(epoch FROM clock_timestamp() - :'t0'), pg_temp.cpu_s() - :cpu0;
VACUUM ANALYZE idempotency_keys;
\echo '== PROCESSING records, as inserted'
SELECT * FROM pg_temp.sizes();

-- 2. SUCCEEDED records, as the service leaves them: each tenth acquired,
-- then completed, then vacuumed (as autovacuum would between bursts), so
-- the dead versions of one tenth are reused by the next.
TRUNCATE idempotency_keys;
SELECT pg_temp.cpu_s() AS cpu0, clock_timestamp() AS t0 \gset
SELECT s FROM generate_series(0, 9) c, LATERAL (VALUES
    (1, format('SELECT pg_temp.run(%L, %L)', 'acquire, complete',
               format(:'acquire', c * :n / 10 + 1, (c + 1) * :n / 10, :'key'))),
    (2, format('SELECT pg_temp.run(%L, %L)', 'acquire, complete', :'complete')),
    (3, 'VACUUM idempotency_keys')) v(o, s)
 ORDER BY c, o \gexec
INSERT INTO figures SELECT 'acquire, complete', :n,
    extract(epoch FROM clock_timestamp() - :'t0'), pg_temp.cpu_s() - :cpu0;
ANALYZE idempotency_keys;
\echo '== SUCCEEDED records, acquired, completed and vacuumed a tenth at a time'
SELECT * FROM pg_temp.sizes();
SELECT status, count(*), round(avg(pg_column_size(k.*)), 1) AS avg_row_bytes
  FROM idempotency_keys k GROUP BY status;

-- 3. The same records packed: the least they can take.
VACUUM FULL idempotency_keys;
\echo '== SUCCEEDED records after VACUUM FULL (packed)'
SELECT * FROM pg_temp.sizes();

-- 4. Sweeping: every record expired (the sweeper's clock two days ahead),
-- deleted in transactions of 1,000 as the background sweeper does, each
-- batch its own statement and transaction: the first half as the server is
-- configured (wal_compression off by default), the second half with
-- wal_compression = lz4. A checkpoint first, because in service the rows a
-- sweeper deletes were last written a retention ago: every page it touches
-- is written whole to WAL once after each checkpoint.
CHECKPOINT;
SELECT current_setting('wal_compression') AS compression \gset
SELECT pg_temp.cpu_s() AS cpu0, clock_timestamp() AS t0 \gset
SELECT format('SELECT pg_temp.run(%L, %L)', 'sweep, wal_compression ' || :'compression',
              'SELECT * FROM idempotency_sweep_batch(NULL, 1000, false, true, 172800000)')
  FROM generate_series(1, :n / 2000) \gexec
INSERT INTO figures SELECT 'sweep, wal_compression ' || :'compression',
    :n - (SELECT count(*) FROM idempotency_keys),
    extract(epoch FROM clock_timestamp() - :'t0'), pg_temp.cpu_s() - :cpu0;
SET wal_compression = lz4;
SELECT pg_temp.cpu_s() AS cpu0, clock_timestamp() AS t0, count(*) AS left0 FROM idempotency_keys \gset
SELECT format('SELECT pg_temp.run(%L, %L)', 'sweep, wal_compression lz4',
              'SELECT * FROM idempotency_sweep_batch(NULL, 1000, false, true, 172800000)')
  FROM generate_series(1, :n / 2000 + 1) \gexec
INSERT INTO figures SELECT 'sweep, wal_compression lz4',
    :left0 - (SELECT count(*) FROM idempotency_keys),
    extract(epoch FROM clock_timestamp() - :'t0'), pg_temp.cpu_s() - :cpu0;
RESET wal_compression;

-- 5. What the deletions leave for (auto)vacuum: the dead rows and their
-- index entries. A checkpoint first again: autovacuum comes later. Its WAL
-- is in the "WAL usage" line of the report.
CHECKPOINT;
SELECT pg_temp.cpu_s() AS cpu0, clock_timestamp() AS t0 \gset
VACUUM (VERBOSE, PARALLEL 0) idempotency_keys;
INSERT INTO figures SELECT 'vacuum after the sweep', :n,
    extract(epoch FROM clock_timestamp() - :'t0'), pg_temp.cpu_s() - :cpu0;

\echo '== Time, CPU and WAL, in total and per 1,000 records'
SELECT f.step, records, round(wall_s, 2) AS wall_s, round(cpu_s, 2) AS cpu_s,
       pg_size_pretty(w.bytes) AS wal, w.fpi AS full_pages,
       round(wall_s * 1000 / records * 1000, 1) AS wall_ms_per_1000,
       round(cpu_s * 1000 / records * 1000, 1) AS cpu_ms_per_1000,
       round(w.bytes / records * 1000 / 1024, 1) AS wal_kib_per_1000
  FROM figures f
  LEFT JOIN (SELECT step, sum(bytes) AS bytes, sum(fpi) AS fpi FROM wal GROUP BY step) w USING (step);
SELECT version();
