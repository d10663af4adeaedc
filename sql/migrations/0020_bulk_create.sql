-- Instances started in batches (docs/ARCHITECTURE.md, "Starting instances in bulk"):
-- orch8.create_instances starts a whole batch set-based; create_instance is a batch of
-- one. The functions are in sql/functions/instances.sql and tree.sql.

INSERT INTO orch8.function_access (name, access) VALUES
('create_instances', 'web'),
('insert_ready_nodes', 'private')
ON CONFLICT (name) DO UPDATE SET access = excluded.access;
