-- Helpers the decisions share: a duration rounded for a caller who will
-- come back, and the "this row changed" notification.
--
-- All comparisons in these functions use the database clock:
-- clock_timestamp() read after the row lock is taken (so time spent waiting
-- for the lock is not mistaken for time the lease had), plus
-- p_clock_offset_ms, which is 0 in production and lets tests move time
-- forward without sleeping. Durations arrive as milliseconds (bigint)
-- because that is what every client driver can bind without a custom
-- interval type.

-- Milliseconds from p_now until p_then, rounded up so that a caller told to
-- come back after that long never comes back too early.
CREATE OR REPLACE FUNCTION idempotency_millis_until(p_then timestamptz, p_now timestamptz)
RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT greatest(0, ceil(extract(epoch FROM (p_then - p_now)) * 1000))::bigint
$$;

-- The channel that carries "this row changed" to every replica's listener;
-- the payload is tenant, scope and key separated by newlines (none of them can
-- contain one).
CREATE OR REPLACE FUNCTION idempotency_notify_if_watched(r idempotency_keys, p_now timestamptz)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF r.watch_until > p_now THEN
        PERFORM pg_notify('idempotency_changes',
                          r.tenant || E'\n' || r.scope || E'\n' || r.idempotency_key);
    END IF;
END;
$$;
