-- The decisions of the coordinator, each made in one round trip under the
-- row lock of the record it is about. All comparisons use the database clock:
-- clock_timestamp() read after the row lock is taken (so time spent waiting
-- for the lock is not mistaken for time the lease had), plus
-- p_clock_offset_ms, which is 0 in production and lets tests move time
-- forward without sleeping.
--
-- Durations arrive as milliseconds (bigint) because that is what every
-- client driver can bind without a custom interval type.

-- Milliseconds from p_now until p_then, rounded up so that a caller told to
-- come back after that long never comes back too early.
CREATE FUNCTION idempotency_millis_until(p_then timestamptz, p_now timestamptz)
RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT greatest(0, ceil(extract(epoch FROM (p_then - p_now)) * 1000))::bigint
$$;

-- The channel that carries "this row changed" to every replica's listener;
-- the payload is tenant, scope and key separated by newlines (none of them can
-- contain one).
CREATE FUNCTION idempotency_notify_if_watched(r idempotency_keys, p_now timestamptz)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF r.watch_until > p_now THEN
        PERFORM pg_notify('idempotency_changes',
                          r.tenant || E'\n' || r.scope || E'\n' || r.idempotency_key);
    END IF;
END;
$$;

-- idempotency_acquire: may the caller run (p_tenant, p_scope, p_key)?
--
-- decision      | when                                   | effect
-- PROCEED       | no row, or the row is past expires_at  | new PROCESSING row, attempt 1
-- CONFLICT      | fingerprint differs                    | none
-- ALREADY_DONE  | SUCCEEDED                              | none
-- EXHAUSTED     | FAILED_PERMANENT                       | none
-- PROCEED       | PROCESSING, lease live, same request id| none: the same lease again
-- IN_PROGRESS   | PROCESSING, lease live                 | none; retry_after = lease left
-- EXHAUSTED     | lease run out or FAILED, no attempts   | FAILED_PERMANENT, last_error says why
-- RETRY_LATER   | FAILED, next_retry_at in the future    | none; retry_after = until then
-- PROCEED       | lease run out or FAILED and due        | attempt + 1, new lease and token
--
-- max_attempts, retention and fingerprint are fixed when the row is created;
-- p_lease_ms applies to the lease this call grants. p_watch_ms > 0 means the
-- caller will wait that long for a change: on IN_PROGRESS the row is marked
-- watched (watch_until) so that its next change notifies. Every change this
-- function makes to a watched row notifies.
--
-- Concurrency: answers that change nothing and cannot be invalidated by a
-- concurrent writer before they are read (ALREADY_DONE: SUCCEEDED is final;
-- CONFLICT: the fingerprint is fixed for the record's life; IN_PROGRESS
-- without a wait) come from a plain read, without taking the row lock, so
-- replays and callers of a busy key never queue behind each other. Every
-- other decision locks the row FOR UPDATE first. When there is no row,
-- INSERT .. ON CONFLICT DO NOTHING lets exactly one of many concurrent
-- callers create it; the others loop, and their next SELECT .. FOR UPDATE
-- waits for the creator's commit and decides on its row.
CREATE FUNCTION idempotency_acquire(
    p_tenant          text,
    p_scope           text,
    p_key             text,
    p_fingerprint     text,
    p_request_id      text,
    p_lease_ms        bigint,
    p_max_attempts    integer,
    p_retention_ms    bigint,
    p_watch_ms        bigint,
    p_clock_offset_ms bigint
)
RETURNS TABLE (decision text, retry_after_ms bigint, rec idempotency_keys)
LANGUAGE plpgsql AS $$
DECLARE
    r           idempotency_keys;
    v_now       timestamptz;
    v_lease     interval := p_lease_ms * interval '1 millisecond';
    v_retention interval := p_retention_ms * interval '1 millisecond';
BEGIN
    SELECT * INTO r FROM idempotency_keys k
     WHERE k.tenant = p_tenant AND k.scope = p_scope AND k.idempotency_key = p_key;
    v_now := clock_timestamp() + p_clock_offset_ms * interval '1 millisecond';
    IF FOUND AND r.expires_at > v_now THEN
        IF r.fingerprint <> p_fingerprint THEN
            decision := 'CONFLICT'; rec := r;
            RETURN NEXT;
            RETURN;
        ELSIF r.status = 'SUCCEEDED' THEN
            decision := 'ALREADY_DONE'; rec := r;
            RETURN NEXT;
            RETURN;
        ELSIF r.status = 'PROCESSING' AND r.lease_expires_at > v_now AND p_watch_ms <= 0
              AND (p_request_id = '' OR p_request_id <> r.lease_request_id) THEN
            decision := 'IN_PROGRESS'; rec := r;
            retry_after_ms := idempotency_millis_until(r.lease_expires_at, v_now);
            RETURN NEXT;
            RETURN;
        END IF;
    END IF;

    LOOP
        SELECT * INTO r FROM idempotency_keys k
         WHERE k.tenant = p_tenant AND k.scope = p_scope AND k.idempotency_key = p_key
           FOR UPDATE;
        v_now := clock_timestamp() + p_clock_offset_ms * interval '1 millisecond';
        EXIT WHEN FOUND;

        INSERT INTO idempotency_keys (
            tenant, scope, idempotency_key, status, fingerprint,
            attempt_count, max_attempts, retention,
            lease_token, lease_request_id, lease_expires_at, fencing_token,
            created_at, updated_at, expires_at)
        VALUES (
            p_tenant, p_scope, p_key, 'PROCESSING', p_fingerprint,
            1, p_max_attempts, v_retention,
            gen_random_uuid(), p_request_id, v_now + v_lease, nextval('idempotency_fencing'),
            v_now, v_now, greatest(v_now + v_retention, v_now + v_lease))
        ON CONFLICT (tenant, scope, idempotency_key) DO NOTHING
        RETURNING * INTO r;
        IF FOUND THEN
            decision := 'PROCEED'; rec := r;
            RETURN NEXT;
            RETURN;
        END IF;
        -- Another caller created the row between our SELECT and INSERT.
    END LOOP;

    IF r.expires_at <= v_now THEN
        -- Expired: the row counts as absent, so this is a new record.
        UPDATE idempotency_keys k SET
            status = 'PROCESSING', fingerprint = p_fingerprint,
            attempt_count = 1, max_attempts = p_max_attempts, retention = v_retention,
            lease_token = gen_random_uuid(), lease_request_id = p_request_id,
            lease_expires_at = v_now + v_lease, lease_outcome = NULL,
            fencing_token = nextval('idempotency_fencing'), offered_until = NULL, offered_to = NULL,
            next_retry_at = NULL, last_error = '', last_error_at = NULL,
            result = NULL, result_content_type = '', result_status_code = 0, result_ref = '',
            checkpoint = '', created_at = v_now, updated_at = v_now, completed_at = NULL,
            expires_at = greatest(v_now + v_retention, v_now + v_lease)
         WHERE k.tenant = p_tenant AND k.scope = p_scope AND k.idempotency_key = p_key
        RETURNING * INTO r;
        PERFORM idempotency_notify_if_watched(r, v_now);
        decision := 'PROCEED'; rec := r;
        RETURN NEXT;
        RETURN;
    END IF;

    IF r.fingerprint <> p_fingerprint THEN
        decision := 'CONFLICT'; rec := r;
        RETURN NEXT;
        RETURN;
    END IF;

    IF r.status = 'SUCCEEDED' THEN
        decision := 'ALREADY_DONE'; rec := r;
        RETURN NEXT;
        RETURN;
    END IF;

    IF r.status = 'FAILED_PERMANENT' THEN
        decision := 'EXHAUSTED'; rec := r;
        RETURN NEXT;
        RETURN;
    END IF;

    IF r.status = 'PROCESSING' AND r.lease_expires_at > v_now THEN
        IF p_request_id <> '' AND p_request_id = r.lease_request_id THEN
            -- The same logical attempt asking again (its answer was lost).
            decision := 'PROCEED';
        ELSE
            decision := 'IN_PROGRESS';
            retry_after_ms := idempotency_millis_until(r.lease_expires_at, v_now);
            IF p_watch_ms > 0
               AND coalesce(r.watch_until, '-infinity') < v_now + p_watch_ms * interval '1 millisecond' THEN
                -- A second more than asked, so that the next waiters of the
                -- same moment find the row marked already and write nothing.
                UPDATE idempotency_keys k SET
                    watch_until = v_now + (p_watch_ms + 1000) * interval '1 millisecond'
                 WHERE k.tenant = p_tenant AND k.scope = p_scope AND k.idempotency_key = p_key
                RETURNING * INTO r;
            END IF;
        END IF;
        rec := r;
        RETURN NEXT;
        RETURN;
    END IF;

    -- Left: PROCESSING whose lease ran out, or FAILED.
    IF r.attempt_count >= r.max_attempts THEN
        UPDATE idempotency_keys k SET
            status = 'FAILED_PERMANENT',
            lease_expires_at = NULL, next_retry_at = NULL,
            last_error = left(CASE WHEN r.status = 'PROCESSING'
                THEN format('the lease of the last attempt (%s of %s) ran out before it completed',
                            r.attempt_count, r.max_attempts)
                ELSE format('no attempts left (%s of %s); last error: %s',
                            r.attempt_count, r.max_attempts, r.last_error)
                END, 4000),
            last_error_at = v_now, completed_at = v_now, updated_at = v_now,
            expires_at = v_now + r.retention
         WHERE k.tenant = p_tenant AND k.scope = p_scope AND k.idempotency_key = p_key
        RETURNING * INTO r;
        PERFORM idempotency_notify_if_watched(r, v_now);
        decision := 'EXHAUSTED'; rec := r;
        RETURN NEXT;
        RETURN;
    END IF;

    IF r.status = 'FAILED' AND r.next_retry_at > v_now THEN
        decision := 'RETRY_LATER'; rec := r;
        retry_after_ms := idempotency_millis_until(r.next_retry_at, v_now);
        RETURN NEXT;
        RETURN;
    END IF;

    -- Take over: the old token is dead from here on.
    UPDATE idempotency_keys k SET
        status = 'PROCESSING', attempt_count = r.attempt_count + 1,
        lease_token = gen_random_uuid(), lease_request_id = p_request_id,
        lease_expires_at = v_now + v_lease, lease_outcome = NULL,
        fencing_token = nextval('idempotency_fencing'), offered_until = NULL, offered_to = NULL,
        next_retry_at = NULL, updated_at = v_now,
        expires_at = greatest(v_now + r.retention, v_now + v_lease)
     WHERE k.tenant = p_tenant AND k.scope = p_scope AND k.idempotency_key = p_key
    RETURNING * INTO r;
    PERFORM idempotency_notify_if_watched(r, v_now);
    decision := 'PROCEED'; rec := r;
    RETURN NEXT;
END;
$$;

-- idempotency_complete: the holder of p_token reports its outcome.
--
-- outcome            | when
-- NOT_FOUND          | no row, or past expires_at
-- LEASE_LOST         | p_token is not the latest lease's token
-- OK (no change)     | the holder already completed with this same kind of outcome
-- ALREADY_COMPLETED  | the holder already completed with another kind of outcome
-- OK                 | otherwise: the outcome is applied, even if the lease ran
--                    | out (or the row was exhausted because of it), as long
--                    | as nobody took over
--
-- p_outcome SUCCESS: SUCCEEDED with the result; expires retention from now.
-- p_outcome FAILURE: FAILED_PERMANENT when p_permanent or no attempts are
--   left; else FAILED, due after p_retry_after_ms or, when that is NULL,
--   min(base * 2^(attempt-1), cap).
-- p_outcome RELEASE: FAILED, due now, and this attempt does not count.
CREATE FUNCTION idempotency_complete(
    p_tenant          text,
    p_scope           text,
    p_key             text,
    p_token           uuid,
    p_outcome         text,
    p_result          bytea,
    p_content_type    text,
    p_status_code     integer,
    p_result_ref      text,
    p_error           text,
    p_permanent       boolean,
    p_retry_after_ms  bigint,
    p_backoff_base_ms bigint,
    p_backoff_cap_ms  bigint,
    p_clock_offset_ms bigint
)
RETURNS TABLE (outcome text, rec idempotency_keys)
LANGUAGE plpgsql AS $$
DECLARE
    r       idempotency_keys;
    v_now   timestamptz;
    v_delay bigint;
BEGIN
    SELECT * INTO r FROM idempotency_keys k
     WHERE k.tenant = p_tenant AND k.scope = p_scope AND k.idempotency_key = p_key
       FOR UPDATE;
    v_now := clock_timestamp() + p_clock_offset_ms * interval '1 millisecond';

    IF NOT FOUND OR r.expires_at <= v_now THEN
        outcome := 'NOT_FOUND';
        RETURN NEXT;
        RETURN;
    END IF;
    IF r.lease_token <> p_token THEN
        outcome := 'LEASE_LOST';
        RETURN NEXT;
        RETURN;
    END IF;
    IF r.lease_outcome IS NOT NULL THEN
        outcome := CASE WHEN r.lease_outcome = p_outcome THEN 'OK' ELSE 'ALREADY_COMPLETED' END;
        rec := r;
        RETURN NEXT;
        RETURN;
    END IF;

    IF p_outcome = 'SUCCESS' THEN
        UPDATE idempotency_keys k SET
            status = 'SUCCEEDED', lease_outcome = 'SUCCESS',
            lease_expires_at = NULL, next_retry_at = NULL,
            result = p_result, result_content_type = p_content_type,
            result_status_code = p_status_code, result_ref = p_result_ref,
            completed_at = v_now, updated_at = v_now, expires_at = v_now + r.retention
         WHERE k.tenant = p_tenant AND k.scope = p_scope AND k.idempotency_key = p_key
        RETURNING * INTO r;
    ELSIF p_outcome = 'FAILURE' AND (p_permanent OR r.attempt_count >= r.max_attempts) THEN
        UPDATE idempotency_keys k SET
            status = 'FAILED_PERMANENT', lease_outcome = 'FAILURE',
            lease_expires_at = NULL, next_retry_at = NULL,
            last_error = p_error, last_error_at = v_now,
            completed_at = v_now, updated_at = v_now, expires_at = v_now + r.retention
         WHERE k.tenant = p_tenant AND k.scope = p_scope AND k.idempotency_key = p_key
        RETURNING * INTO r;
    ELSIF p_outcome = 'FAILURE' THEN
        -- The exponent is capped so that a large base cannot overflow float8;
        -- 2^40 already exceeds any sensible cap.
        v_delay := coalesce(p_retry_after_ms,
            least(p_backoff_base_ms * power(2::float8, least(r.attempt_count - 1, 40)),
                  p_backoff_cap_ms)::bigint);
        UPDATE idempotency_keys k SET
            status = 'FAILED', lease_outcome = 'FAILURE',
            lease_expires_at = NULL,
            next_retry_at = v_now + v_delay * interval '1 millisecond',
            last_error = p_error, last_error_at = v_now,
            completed_at = NULL, updated_at = v_now,
            expires_at = v_now + v_delay * interval '1 millisecond' + r.retention
         WHERE k.tenant = p_tenant AND k.scope = p_scope AND k.idempotency_key = p_key
        RETURNING * INTO r;
    ELSIF p_outcome = 'RELEASE' THEN
        UPDATE idempotency_keys k SET
            status = 'FAILED', lease_outcome = 'RELEASE',
            attempt_count = greatest(r.attempt_count - 1, 0),
            lease_expires_at = NULL, next_retry_at = v_now,
            completed_at = NULL, updated_at = v_now, expires_at = v_now + r.retention
         WHERE k.tenant = p_tenant AND k.scope = p_scope AND k.idempotency_key = p_key
        RETURNING * INTO r;
    ELSE
        RAISE EXCEPTION 'idempotency_complete: unknown outcome %', p_outcome;
    END IF;

    PERFORM idempotency_notify_if_watched(r, v_now);
    outcome := 'OK'; rec := r;
    RETURN NEXT;
END;
$$;

-- idempotency_extend_lease: the holder's heartbeat (the server's clock
-- decides; an expired lease cannot be revived).
--
-- outcome            | when
-- NOT_FOUND          | no row, or past expires_at
-- LEASE_LOST         | p_token is not the latest lease's token
-- LEASE_EXPIRED      | the lease ended: it ran out (whether or not the row
--                    | was reclaimed), or its holder completed it
-- OK                 | lease_expires_at = min(max(old, now) + extend, now + max lease);
--                    | the checkpoint is replaced when p_checkpoint is not NULL
CREATE FUNCTION idempotency_extend_lease(
    p_tenant          text,
    p_scope           text,
    p_key             text,
    p_token           uuid,
    p_extend_ms       bigint,
    p_max_lease_ms    bigint,
    p_checkpoint      bytea,
    p_clock_offset_ms bigint
)
RETURNS TABLE (outcome text, rec idempotency_keys)
LANGUAGE plpgsql AS $$
DECLARE
    r        idempotency_keys;
    v_now    timestamptz;
    v_expiry timestamptz;
BEGIN
    SELECT * INTO r FROM idempotency_keys k
     WHERE k.tenant = p_tenant AND k.scope = p_scope AND k.idempotency_key = p_key
       FOR UPDATE;
    v_now := clock_timestamp() + p_clock_offset_ms * interval '1 millisecond';

    IF NOT FOUND OR r.expires_at <= v_now THEN
        outcome := 'NOT_FOUND';
        RETURN NEXT;
        RETURN;
    END IF;
    IF r.lease_token <> p_token THEN
        outcome := 'LEASE_LOST';
        RETURN NEXT;
        RETURN;
    END IF;
    IF r.lease_outcome IS NOT NULL OR r.status <> 'PROCESSING' OR r.lease_expires_at <= v_now THEN
        outcome := 'LEASE_EXPIRED';
        RETURN NEXT;
        RETURN;
    END IF;

    v_expiry := least(greatest(r.lease_expires_at, v_now) + p_extend_ms * interval '1 millisecond',
                      v_now + p_max_lease_ms * interval '1 millisecond');
    UPDATE idempotency_keys k SET
        lease_expires_at = v_expiry,
        checkpoint = coalesce(p_checkpoint, r.checkpoint),
        updated_at = v_now,
        expires_at = greatest(r.expires_at, v_expiry)
     WHERE k.tenant = p_tenant AND k.scope = p_scope AND k.idempotency_key = p_key
    RETURNING * INTO r;
    PERFORM idempotency_notify_if_watched(r, v_now);
    outcome := 'OK'; rec := r;
    RETURN NEXT;
END;
$$;

-- idempotency_get: the live record, or no row when there is none or it has
-- expired.
CREATE FUNCTION idempotency_get(
    p_tenant          text,
    p_scope           text,
    p_key             text,
    p_clock_offset_ms bigint
)
RETURNS SETOF idempotency_keys
LANGUAGE sql STABLE AS $$
    SELECT * FROM idempotency_keys k
     WHERE k.tenant = p_tenant AND k.scope = p_scope AND k.idempotency_key = p_key
       AND k.expires_at > clock_timestamp() + p_clock_offset_ms * interval '1 millisecond'
$$;

-- idempotency_watch: marks the live record watched for p_watch_ms (so its
-- changes notify) and returns it; no row when there is none or it expired.
CREATE FUNCTION idempotency_watch(
    p_tenant          text,
    p_scope           text,
    p_key             text,
    p_watch_ms        bigint,
    p_clock_offset_ms bigint
)
RETURNS SETOF idempotency_keys
LANGUAGE sql AS $$
    UPDATE idempotency_keys k SET
        watch_until = greatest(k.watch_until,
            clock_timestamp() + (p_clock_offset_ms + p_watch_ms) * interval '1 millisecond')
     WHERE k.tenant = p_tenant AND k.scope = p_scope AND k.idempotency_key = p_key
       AND k.expires_at > clock_timestamp() + p_clock_offset_ms * interval '1 millisecond'
    RETURNING *
$$;
