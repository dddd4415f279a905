-- Cycles as the server's group commit runs them: Acquires of new keys in
-- batches of p_batch, each batch committed, then the batch's Completes
-- (success, a small JSON result), committed. Through the batch functions of
-- one kind (idempotency_acquire_batch, idempotency_complete_batch: each a
-- call of idempotency_call_batch), which every release has, so that the
-- same script measures an older tree too. Loaded by bench/wal/breakdown.sh.
--
-- Keys come from wal_key. With p_checkpoint_every, a checkpoint every that
-- many cycles (after the batch that reaches it), so that the first change
-- of each page after it is logged whole, as a running PostgreSQL does
-- every checkpoint_timeout.

-- The key of call p_position (from 1) of batch p_batch_no (from 0) of a run
-- of p_cycles cycles in batches of p_batch: the prefix and the two
-- counters, in order (each counter padded to one width for the run, so that
-- no two keys of a run are alike), unless p_random: then a random UUID, as
-- many callers send them, so that each new key lands on a leaf page of the
-- primary key anywhere in it.
CREATE OR REPLACE FUNCTION wal_key(p_prefix text, p_batch_no integer, p_position integer,
                                   p_cycles integer, p_batch integer, p_random boolean)
RETURNS text LANGUAGE sql VOLATILE AS $$
    SELECT CASE WHEN p_random THEN gen_random_uuid()::text
                ELSE format('%s-%s-%s', p_prefix,
                            lpad(p_batch_no::text, greatest(5, length((p_cycles / p_batch)::text)), '0'),
                            lpad(p_position::text, greatest(2, length(p_batch::text)), '0'))
           END
$$;

CREATE OR REPLACE PROCEDURE wal_cycles(p_cycles integer, p_batch integer, p_prefix text,
                                       p_checkpoint_every integer DEFAULT 0,
                                       p_random_keys boolean DEFAULT false)
LANGUAGE plpgsql AS $$
DECLARE
    v_keys   text[];
    v_tokens uuid[];
    v_none   text[] := array_fill(''::text, ARRAY[p_batch]);
BEGIN
    FOR i IN 0 .. p_cycles / p_batch - 1 LOOP
        -- In ascending order, bytewise, as the server sorts a batch's calls.
        SELECT array_agg(k ORDER BY k COLLATE "C") INTO v_keys
          FROM (SELECT wal_key(p_prefix, i, g, p_cycles, p_batch, p_random_keys) AS k
                  FROM generate_series(1, p_batch) g) keys;
        SELECT array_agg((b.rec).lease_token ORDER BY b.ord) INTO v_tokens
          FROM idempotency_acquire_batch(
                   array_fill('tenant'::text, ARRAY[p_batch]),
                   array_fill('payments'::text, ARRAY[p_batch]), v_keys,
                   array_fill(repeat('f', 64), ARRAY[p_batch]), v_none,
                   array_fill(30000::bigint, ARRAY[p_batch]), array_fill(3, ARRAY[p_batch]),
                   array_fill(86400000::bigint, ARRAY[p_batch]), array_fill(0::bigint, ARRAY[p_batch]),
                   0) b;
        COMMIT;
        PERFORM 1
          FROM idempotency_complete_batch(
                   array_fill('tenant'::text, ARRAY[p_batch]),
                   array_fill('payments'::text, ARRAY[p_batch]), v_keys, v_tokens,
                   array_fill('SUCCESS'::text, ARRAY[p_batch]),
                   array_fill(convert_to('{"charge":"ch_1","amount":1200}', 'UTF8'), ARRAY[p_batch]),
                   array_fill('application/json'::text, ARRAY[p_batch]), array_fill(200, ARRAY[p_batch]),
                   array_fill(''::text, ARRAY[p_batch]), array_fill(''::text, ARRAY[p_batch]),
                   array_fill(false, ARRAY[p_batch]), array_fill(NULL::bigint, ARRAY[p_batch]),
                   array_fill(100::bigint, ARRAY[p_batch]), array_fill(60000::bigint, ARRAY[p_batch]),
                   0);
        COMMIT;
        IF p_checkpoint_every > 0 AND (i + 1) * p_batch % p_checkpoint_every < p_batch THEN
            CHECKPOINT;
        END IF;
    END LOOP;
END;
$$;

-- The same cycles through the physical limit's SQL (bench/limit/limit.sql,
-- loaded by breakdown.sh for REFERENCE=limit), storing the same key, the
-- same 64-character fingerprint and the same result, one transaction per
-- call as its pgbench script runs them: what the limit writes for the
-- values a record here holds (bench/limit/cycle.pgbench stores a 2-byte
-- fingerprint and a 2-byte result). Keys and checkpoints as wal_cycles's.
CREATE OR REPLACE PROCEDURE limit_cycles(p_cycles integer, p_batch integer, p_prefix text,
                                         p_checkpoint_every integer DEFAULT 0,
                                         p_random_keys boolean DEFAULT false)
LANGUAGE plpgsql AS $$
DECLARE
    v_key   text;
    v_token uuid;
BEGIN
    FOR i IN 0 .. p_cycles / p_batch * p_batch - 1 LOOP
        v_key := wal_key(p_prefix, i / p_batch, i % p_batch + 1, p_cycles, p_batch, p_random_keys);
        SELECT token INTO v_token
          FROM limit_acquire('tenant', 'payments', v_key, repeat('f', 64), 900);
        COMMIT;
        PERFORM limit_complete('tenant', 'payments', v_key, v_token,
                               convert_to('{"charge":"ch_1","amount":1200}', 'UTF8'));
        COMMIT;
        IF p_checkpoint_every > 0 AND (i + 1) % p_checkpoint_every = 0 THEN
            CHECKPOINT;
        END IF;
    END LOOP;
END;
$$;
