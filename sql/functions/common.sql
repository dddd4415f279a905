-- Helpers the decisions share: a duration rounded for a caller who will
-- come back, the "this row changed" notification, and the error a write
-- raises when its row changed since the function read it.
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

-- Called when a write does not find the row version its function read
-- under a row lock (every single-key UPDATE after a locked read checks
-- `updated_at`, which each change sets). On one PostgreSQL the lock rules
-- that out. On Citus a read does not wait for a shard move, only a write
-- does: a call can read (and lock) its row on the old placement and then
-- write on the new one, where the row may be another version, or not yet
-- visible to the statement's snapshot, taken before the move's copy
-- committed. Nothing is written: the transaction rolls back whole, and the
-- server runs a batch's calls again one by one or answers UNAVAILABLE,
-- which the caller retries (every such call is idempotent).
CREATE OR REPLACE FUNCTION idempotency_changed_meanwhile()
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the record changed between the call''s read and its write; nothing was written'
        USING ERRCODE = 'serialization_failure',
              HINT = 'On Citus a shard moved meanwhile. Retry the call.';
END;
$$;

-- idempotency_open_record: how every call on one record that holder or
-- administrator makes begins (idempotency_complete, idempotency_extend_lease,
-- idempotency_admin_act). The record is locked (FOR UPDATE, held until the
-- transaction ends), then the clock read (after the lock, see above); the
-- outcome is 'NOT_FOUND' when there is no record or it has expired,
-- 'LEASE_LOST' when p_token is given and is not the latest lease's token,
-- else NULL: the caller goes on with rec as of now.
CREATE OR REPLACE FUNCTION idempotency_open_record(
    p_tenant          text,
    p_scope           text,
    p_key             text,
    p_token           uuid,
    p_clock_offset_ms bigint,
    OUT outcome       text,
    OUT now           timestamptz,
    OUT rec           idempotency_keys
)
LANGUAGE plpgsql AS $$
BEGIN
    SELECT * INTO rec FROM idempotency_keys k
     WHERE k.tenant = p_tenant AND k.scope = p_scope AND k.idempotency_key = p_key
       FOR UPDATE;
    now := clock_timestamp() + p_clock_offset_ms * interval '1 millisecond';
    IF NOT FOUND OR rec.expires_at <= now THEN
        outcome := 'NOT_FOUND';
    ELSIF rec.lease_token <> p_token THEN
        outcome := 'LEASE_LOST';
    END IF;
END;
$$;
