-- Receipts lost with a failed primary when the lease went with them: keep_lost_receipts
-- (sql/functions/steps.sql) lets the runner record them after finish_step refused its lease
-- and after an outage; keep_lost_receipt is its per-receipt helper, and
-- require_step_result the one list of step results, a helper of finish_step and it.

INSERT INTO orch8.function_access (name, access) VALUES
('require_step_result', 'private'),
('keep_lost_receipt', 'private');
