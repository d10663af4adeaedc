-- The settling CAS answers the row it wrote (docs/ARCHITECTURE.md, "A step reads its
-- receipt once"). swap_effect_receipt is cas_effect_receipt's UPDATE with RETURNING:
-- settle_effect reports the receipt as the won CAS left it instead of reading it again,
-- and cas_effect_receipt answers whether it won through it. Its body lives in
-- sql/functions/effects.sql; here only its access row.

INSERT INTO orch8.function_access (name, access) VALUES
('swap_effect_receipt', 'private')
ON CONFLICT (name) DO UPDATE SET access = excluded.access;
