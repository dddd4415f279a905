-- On a Citus coordinator, after the function files: the single-key calls
-- become distributed functions, colocated with idempotency_keys and
-- distributed by their key argument (p_key). Citus then sends a call
-- (`SELECT ... FROM idempotency_acquire($1, ...)`, alone in its
-- transaction) whole to the worker holding the key's shard, where it runs
-- as on one PostgreSQL: its statements, its row lock and its commit on
-- that node. Every other function of ours exists on every node too (Citus
-- propagates CREATE FUNCTION), undistributed: the helpers these call, and
-- those that span keys (batches, sweeping, the recovery feed), which run
-- on the coordinator.
--
-- Applied at every migration of a Citus database (src/store/migrate.rs),
-- after the function files: CREATE OR REPLACE keeps a function delegated,
-- but a file that drops and re-creates one leaves it undistributed until
-- this runs. Does nothing for functions already delegated.
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN
        SELECT p.oid::regprocedure
          FROM pg_proc p
         WHERE p.proname IN ('idempotency_acquire', 'idempotency_complete',
                             'idempotency_extend_lease', 'idempotency_get',
                             'idempotency_watch', 'idempotency_admin_act', 'idempotency_admin_delete')
           AND p.pronamespace = (SELECT relnamespace FROM pg_class
                                  WHERE oid = 'idempotency_keys'::regclass)
           AND NOT EXISTS (SELECT FROM pg_dist_object o
                            WHERE o.classid = 'pg_proc'::regclass AND o.objid = p.oid
                              AND o.distribution_argument_index IS NOT NULL)
    LOOP
        PERFORM create_distributed_function(f, 'p_key',
                                       colocate_with := 'idempotency_keys');
    END LOOP;
END
$$;
