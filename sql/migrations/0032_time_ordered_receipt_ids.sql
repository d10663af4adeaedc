-- Receipt ids that begin with their instance's time (docs/ARCHITECTURE.md, "A new
-- scope's receipt ids begin with their instance's time"). The derivation of a scope's
-- receipt ids is a property of the scope, fixed when it is made: every scope that exists
-- now is version 1 (deterministic_effect_id, so no attempt in flight is sent under a
-- second key), and ensure_effect_scope makes version 2 from now on. The default stays 1:
-- a scope written by code that does not name a version used version 1's derivation.

ALTER TABLE orch8.continuity_executions
ADD COLUMN effect_id_version smallint NOT NULL DEFAULT 1
CHECK (effect_id_version IN (1, 2));

COMMENT ON COLUMN orch8.continuity_executions.effect_id_version IS
'How the scope''s receipt ids are derived, fixed for the life of the scope '
'(effect_receipt_id): 1, deterministic_effect_id (every scope made before migration '
'0032); 2, the same id led by the instance id''s first 6 bytes, its time (every scope '
'ensure_effect_scope makes since).';

COMMENT ON COLUMN orch8.continuity_executions.continuity_id IS
'The ledger scope''s id, hashed into every receipt id of the instance '
'(effect_receipt_id). A new scope derives it from the instance id (effect_scope_id '
'with prefix orch8-effect-scope-v1).';

COMMENT ON COLUMN orch8.effect_receipts.id IS
'The receipt id, from its position: effect_receipt_id(scope''s effect_id_version, '
'continuity, epoch, instance, path, attempt), so a rerun of the same attempt finds the '
'same receipt. It is also the default idempotency key (see idempotency_key).';
