-- On a Citus coordinator (a database with the citus extension), after the
-- numbered migrations: idempotency_keys becomes a distributed table, its
-- rows spread over the workers' shards by the hash of idempotency_key.
-- Every single-key call names the key, so Citus routes each to one shard;
-- the key is part of the primary key, as Citus requires of every unique
-- constraint. The schema's later changes (new numbered migrations) reach
-- the shards through Citus's DDL propagation.
--
-- The sequence idempotency_fencing is the column default of fencing_token,
-- so Citus creates it on every node, each node's copy drawing from its own
-- range (node group g from g * 2^48 + 1): see idempotency_acquire for why a
-- key's fencing tokens still only grow.
--
-- Applied at every migration of a Citus database (src/store/migrate.rs);
-- does nothing once the table is distributed. Rows the table held before
-- are copied into the shards, and the coordinator's local copy emptied.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_dist_partition
                    WHERE logicalrelid = 'idempotency_keys'::regclass) THEN
        PERFORM create_distributed_table('idempotency_keys', 'idempotency_key');
        PERFORM truncate_local_data_after_distributing_table('idempotency_keys');
    END IF;
END
$$;
