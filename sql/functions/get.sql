-- idempotency_get: the live record, or no row when there is none or it has
-- expired.
--
-- PL/pgSQL rather than SQL, so that PostgreSQL does not inline it into the
-- caller's statement: Citus delegates the call whole to the node holding
-- the key only while it stays a function call (an inlined query with the
-- statement's parameters it refuses).
CREATE OR REPLACE FUNCTION idempotency_get(
    p_tenant          text,
    p_scope           text,
    p_key             text,
    p_clock_offset_ms bigint
)
RETURNS SETOF idempotency_keys
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN QUERY
    SELECT * FROM idempotency_keys k
     WHERE k.tenant = p_tenant AND k.scope = p_scope AND k.idempotency_key = p_key
       AND k.expires_at > clock_timestamp() + p_clock_offset_ms * interval '1 millisecond';
END;
$$;
