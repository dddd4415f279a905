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
CREATE OR REPLACE FUNCTION idempotency_extend_lease(
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
    o        record;
    r        idempotency_keys;
    v_now    timestamptz;
    v_expiry timestamptz;
BEGIN
    o := idempotency_open_record(p_tenant, p_scope, p_key, p_token, p_clock_offset_ms);
    IF o.outcome IS NOT NULL THEN
        outcome := o.outcome;
        RETURN NEXT;
        RETURN;
    END IF;
    r := o.rec;
    v_now := o.now;
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
       AND k.updated_at = r.updated_at
    RETURNING * INTO r;
    IF NOT FOUND THEN
        PERFORM idempotency_changed_meanwhile();
    END IF;
    PERFORM idempotency_notify_if_watched(r, v_now);
    outcome := 'OK'; rec := r;
    RETURN NEXT;
END;
$$;
