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
CREATE OR REPLACE FUNCTION idempotency_complete(
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
    o       record;
    r       idempotency_keys;
    v_now   timestamptz;
    v_delay bigint;
BEGIN
    o := idempotency_open_record(p_tenant, p_scope, p_key, p_token, p_clock_offset_ms);
    IF o.outcome IS NOT NULL THEN
        outcome := o.outcome;
        RETURN NEXT;
        RETURN;
    END IF;
    r := o.rec;
    v_now := o.now;
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
           AND k.updated_at = r.updated_at
        RETURNING * INTO r;
    ELSIF p_outcome = 'FAILURE' AND (p_permanent OR r.attempt_count >= r.max_attempts) THEN
        UPDATE idempotency_keys k SET
            status = 'FAILED_PERMANENT', lease_outcome = 'FAILURE',
            lease_expires_at = NULL, next_retry_at = NULL,
            last_error = p_error, last_error_at = v_now,
            completed_at = v_now, updated_at = v_now, expires_at = v_now + r.retention
         WHERE k.tenant = p_tenant AND k.scope = p_scope AND k.idempotency_key = p_key
           AND k.updated_at = r.updated_at
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
           AND k.updated_at = r.updated_at
        RETURNING * INTO r;
    ELSIF p_outcome = 'RELEASE' THEN
        UPDATE idempotency_keys k SET
            status = 'FAILED', lease_outcome = 'RELEASE',
            attempt_count = greatest(r.attempt_count - 1, 0),
            lease_expires_at = NULL, next_retry_at = v_now,
            completed_at = NULL, updated_at = v_now, expires_at = v_now + r.retention
         WHERE k.tenant = p_tenant AND k.scope = p_scope AND k.idempotency_key = p_key
           AND k.updated_at = r.updated_at
        RETURNING * INTO r;
    ELSE
        RAISE EXCEPTION 'idempotency_complete: unknown outcome %', p_outcome;
    END IF;
    -- Each UPDATE above applies to the row as read under the lock.
    IF NOT FOUND THEN
        PERFORM idempotency_changed_meanwhile();
    END IF;

    PERFORM idempotency_notify_if_watched(r, v_now);
    outcome := 'OK'; rec := r;
    RETURN NEXT;
END;
$$;
