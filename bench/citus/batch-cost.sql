-- A node's share of batches, run on the node itself by one session: what a
-- worker spends on the routed batch's own body (idempotency_call_batch_at),
-- without the server, the network, the other node or the run's drift.
-- Loaded by bench/citus/batch-cost.sh.

-- p_n keys whose shards this node holds, each p_prefix and a number: those
-- the routed batch itself finds here (idempotency_local_shards).
CREATE OR REPLACE FUNCTION batch_cost_keys(p_prefix text, p_n integer) RETURNS text[]
LANGUAGE sql AS $$
    SELECT (array_agg(u.k ORDER BY u.o) FILTER (WHERE u.s IS NOT NULL))[1:p_n]
      FROM (SELECT ARRAY(SELECT p_prefix || '-' || g FROM generate_series(1, p_n * 4) g) AS keys) c,
           unnest(c.keys, idempotency_local_shards(c.keys)) WITH ORDINALITY u(k, s, o)
$$;

-- The session's CPU time so far, user and system, in clock ticks (10 ms):
-- fields 14 and 15 of /proc/self/stat, counted after the command's name.
CREATE OR REPLACE FUNCTION batch_cost_ticks() RETURNS bigint
LANGUAGE sql AS $$
    SELECT s[12]::bigint + s[13]::bigint
      FROM regexp_split_to_array(split_part(pg_read_file('/proc/self/stat'), ') ', 2), ' ') s
$$;

-- p_batches batches as the server sends a node: each p_batch Acquires of new
-- keys beside the successes of the previous batch's leases (a small JSON
-- result), each batch committed. Says, in a NOTICE, the session's CPU time
-- (user and system, from /proc/self/stat) and the wall time per cycle.
CREATE OR REPLACE PROCEDURE batch_cost_cycles(p_batches integer, p_batch integer, p_prefix text)
LANGUAGE plpgsql AS $$
DECLARE
    v_all    text[];
    v_new    text[];
    v_old    text[] := '{}';
    v_tok    uuid[] := '{}';
    v_keys   text[];
    v_acq    boolean[];
    n        integer;
    m        integer;
    t0       bigint;
    t1       bigint;
    w0       timestamptz;
    v_next   uuid[];
BEGIN
    COMMIT;
    t0 := batch_cost_ticks();
    w0 := clock_timestamp();
    FOR i IN 0 .. p_batches LOOP
        -- Keys in chunks of 64 batches: a slice of a long array of text
        -- costs in proportion to its offset.
        IF i % 64 = 0 THEN
            v_all := batch_cost_keys(p_prefix || '-' || i, 64 * p_batch);
        END IF;
        v_new := v_all[(i % 64) * p_batch + 1 : (i % 64 + 1) * p_batch];
        IF i = p_batches THEN v_new := '{}'; END IF;
        n := cardinality(v_new); m := cardinality(v_old);
        v_keys := v_new || v_old;
        v_acq := array_fill(true, ARRAY[n]) || array_fill(false, ARRAY[m]);
        SELECT array_agg((b.rec).lease_token ORDER BY b.ord) FILTER (WHERE b.ord <= n) INTO v_next
          FROM idempotency_call_batch_at(
                   v_keys[1], v_acq,
                   array_fill('tenant'::text, ARRAY[n + m]), array_fill('payments'::text, ARRAY[n + m]), v_keys,
                   array_fill(repeat('f', 64), ARRAY[n]) || array_fill(NULL::text, ARRAY[m]),
                   array_fill(''::text, ARRAY[n]) || array_fill(NULL::text, ARRAY[m]),
                   array_fill(30000::bigint, ARRAY[n]) || array_fill(NULL::bigint, ARRAY[m]),
                   array_fill(3, ARRAY[n]) || array_fill(NULL::integer, ARRAY[m]),
                   array_fill(86400000::bigint, ARRAY[n]) || array_fill(NULL::bigint, ARRAY[m]),
                   array_fill(0::bigint, ARRAY[n]) || array_fill(NULL::bigint, ARRAY[m]),
                   array_fill(NULL::uuid, ARRAY[n]) || v_tok,
                   array_fill(NULL::text, ARRAY[n]) || array_fill('SUCCESS'::text, ARRAY[m]),
                   array_fill(NULL::bytea, ARRAY[n]) || array_fill(convert_to('{"charge":"ch_1","amount":1200}', 'UTF8'), ARRAY[m]),
                   array_fill(NULL::text, ARRAY[n]) || array_fill('application/json'::text, ARRAY[m]),
                   array_fill(NULL::integer, ARRAY[n]) || array_fill(200, ARRAY[m]),
                   array_fill(NULL::text, ARRAY[n]) || array_fill(''::text, ARRAY[m]),
                   array_fill(NULL::text, ARRAY[n]) || array_fill(''::text, ARRAY[m]),
                   array_fill(NULL::boolean, ARRAY[n]) || array_fill(false, ARRAY[m]),
                   array_fill(NULL::bigint, ARRAY[n + m]),
                   array_fill(NULL::bigint, ARRAY[n]) || array_fill(100::bigint, ARRAY[m]),
                   array_fill(NULL::bigint, ARRAY[n]) || array_fill(60000::bigint, ARRAY[m]),
                   0, NULL) b;
        v_old := v_new; v_tok := coalesce(v_next, '{}');
        IF cardinality(v_tok) <> cardinality(v_old) THEN
            RAISE EXCEPTION 'batch % granted % of % leases', i, cardinality(v_tok), cardinality(v_old);
        END IF;
        COMMIT;
    END LOOP;
    t1 := batch_cost_ticks();
    RAISE NOTICE 'cpu_us_per_cycle=% wall_us_per_cycle=%', round((t1 - t0) * 10000.0 / (p_batches * p_batch)),
        round(extract(epoch FROM clock_timestamp() - w0) * 1e6 / (p_batches * p_batch));
END;
$$;
