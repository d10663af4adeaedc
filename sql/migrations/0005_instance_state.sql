-- Per-instance key-value state for the set_state / get_state builtins.
-- The table is orch8.instance_kv_state: the name orch8.instance_state is taken by the
-- instance state enum (a table's row type would collide with it).
-- Functions live in sql/functions/state_kv.sql.

CREATE TABLE orch8.instance_kv_state (
    tenant_id text NOT NULL,
    instance_id uuid NOT NULL,
    key text NOT NULL CHECK (octet_length(key) BETWEEN 1 AND 256),
    value jsonb NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT orch8.now(),
    PRIMARY KEY (tenant_id, instance_id, key),
    FOREIGN KEY (tenant_id, instance_id) REFERENCES orch8.task_instances (tenant_id, id)
);

COMMENT ON TABLE orch8.instance_kv_state IS
'Per-instance key-value state (set_state / get_state handlers). Written only through '
'orch8.set_instance_state, which the lease token fences; a JSON null is stored as ''null''.';
