-- Time-ordered instance ids (docs/ARCHITECTURE.md, "Flat as history grows"). A new
-- instance's id is a version-7 UUID (orch8.time_ordered_uuid, chosen by
-- create_instances) and a new ledger scope's ids begin with their instance id's time
-- (orch8.effect_scope_id), so that the indexes leading with either grow at one edge
-- instead of taking each new entry at a random page: with a large history the random
-- pages were no longer cached, and each first touch after a checkpoint wrote a full-page
-- image (49 kB of WAL per guarded step beside 1,000,000 finished instances, against 7 kB
-- on an empty database). Existing ids and scopes stay as they are: an instance keeps its
-- id, and ensure_effect_scope reads an existing scope from its row.

INSERT INTO orch8.function_access (name, access) VALUES
('time_ordered_uuid', 'private')
ON CONFLICT (name) DO UPDATE SET access = excluded.access;
