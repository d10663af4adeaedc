-- Bulk operator actions by filter (issue 12): who may call the functions of
-- sql/functions/bulk.sql. bulk_count is a read (STABLE: the web and the auditor may call
-- it); bulk_apply writes, so the web role needs its row here; the per-instance helper is
-- private (it runs inside bulk_apply). Its limit, bulk_batch, is in sql/functions/limits.sql.

INSERT INTO orch8.function_access (name, access) VALUES
('bulk_apply', 'web'),
('bulk_apply_one', 'private')
ON CONFLICT (name) DO UPDATE SET access = excluded.access;
