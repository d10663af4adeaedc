-- Receipts lost with a failed primary when the lease went with them: keep_lost_receipt
-- (sql/functions/steps.sql) lets the runner record one after finish_step refused its lease;
-- require_step_result is the one list of step results, a helper of finish_step and it.

INSERT INTO orch8.function_access (name, access) VALUES
('require_step_result', 'private');
