-- Cycles as this release's group commit runs them once it is busy: each
-- transaction is one idempotency_call_batch that completes (success, a small
-- JSON result) the p_batch keys acquired by the transaction before it and
-- acquires p_batch new keys, so a cycle's two calls share a commit. Needs
-- idempotency_call_batch (an older tree measures with bench/wal/cycles.sql).
-- Loaded by bench/wal/instructions.sh with MIXED=1.
CREATE OR REPLACE PROCEDURE wal_cycles_mixed(p_cycles integer, p_batch integer, p_prefix text)
LANGUAGE plpgsql AS $$
DECLARE
    b        integer := p_batch;
    n        integer;
    v_keys   text[];
    v_tokens uuid[];
    v_prev   text[] := '{}';
    v_held   uuid[] := '{}';
BEGIN
    FOR i IN 0 .. p_cycles / p_batch LOOP
        SELECT array_agg(format('%s-%s-%s', p_prefix, lpad(i::text, 5, '0'), lpad(g::text, 2, '0'))) INTO v_keys
          FROM generate_series(1, b) g;
        n := cardinality(v_prev);
        SELECT array_agg((x.rec).lease_token ORDER BY x.ord) FILTER (WHERE x.decision IS NOT NULL)
          INTO v_tokens
          FROM idempotency_call_batch(
                   array_fill(false, ARRAY[n]) || array_fill(true, ARRAY[b]),
                   array_fill('tenant'::text, ARRAY[n + b]),
                   array_fill('payments'::text, ARRAY[n + b]), v_prev || v_keys,
                   array_fill(NULL::text, ARRAY[n]) || array_fill(repeat('f', 64), ARRAY[b]),
                   array_fill(NULL::text, ARRAY[n]) || array_fill(''::text, ARRAY[b]),
                   array_fill(NULL::bigint, ARRAY[n]) || array_fill(30000::bigint, ARRAY[b]),
                   array_fill(NULL::integer, ARRAY[n]) || array_fill(3, ARRAY[b]),
                   array_fill(NULL::bigint, ARRAY[n]) || array_fill(86400000::bigint, ARRAY[b]),
                   array_fill(NULL::bigint, ARRAY[n]) || array_fill(0::bigint, ARRAY[b]),
                   v_held || array_fill(NULL::uuid, ARRAY[b]),
                   array_fill('SUCCESS'::text, ARRAY[n]) || array_fill(NULL::text, ARRAY[b]),
                   array_fill(convert_to('{"charge":"ch_1","amount":1200}', 'UTF8'), ARRAY[n])
                       || array_fill(NULL::bytea, ARRAY[b]),
                   array_fill('application/json'::text, ARRAY[n]) || array_fill(NULL::text, ARRAY[b]),
                   array_fill(200, ARRAY[n]) || array_fill(NULL::integer, ARRAY[b]),
                   array_fill(''::text, ARRAY[n]) || array_fill(NULL::text, ARRAY[b]),
                   array_fill(''::text, ARRAY[n]) || array_fill(NULL::text, ARRAY[b]),
                   array_fill(false, ARRAY[n]) || array_fill(NULL::boolean, ARRAY[b]),
                   array_fill(NULL::bigint, ARRAY[n + b]),
                   array_fill(100::bigint, ARRAY[n]) || array_fill(NULL::bigint, ARRAY[b]),
                   array_fill(60000::bigint, ARRAY[n]) || array_fill(NULL::bigint, ARRAY[b]),
                   false, 0) x;
        COMMIT;
        v_prev := v_keys;
        v_held := v_tokens;
    END LOOP;
END;
$$;
