-- idempotency_watch: marks the live record watched for p_watch_ms (so its
-- changes notify) and returns it; no row when there is none or it expired.
--
-- The clock is read once into a variable (PL/pgSQL) rather than inside the
-- UPDATE, which a sharded table refuses; it is read before the row lock, and
-- a Watch compares it only with the record's expiry.
CREATE OR REPLACE FUNCTION idempotency_watch(
    p_tenant          text,
    p_scope           text,
    p_key             text,
    p_watch_ms        bigint,
    p_clock_offset_ms bigint
)
RETURNS SETOF idempotency_keys
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := clock_timestamp() + p_clock_offset_ms * interval '1 millisecond';
BEGIN
    RETURN QUERY
    UPDATE idempotency_keys k SET
        watch_until = greatest(k.watch_until, v_now + p_watch_ms * interval '1 millisecond')
     WHERE k.tenant = p_tenant AND k.scope = p_scope AND k.idempotency_key = p_key
       AND k.expires_at > v_now
    RETURNING k.*;
END;
$$;
