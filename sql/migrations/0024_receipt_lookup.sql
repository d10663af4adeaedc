-- Looking a receipt up by the keys people hold (docs/ARCHITECTURE.md, "Finding a
-- receipt by a provider's key"): a provider's dashboard shows the idempotency key we sent
-- or the receipt id it gave back, and both were a sequential scan of the receipts.
--
-- The idempotency key never changes after the insert, so an index on it keeps the settle
-- a HOT update; it is partial, leaving out the common case where the key is the receipt
-- id itself (the primary key finds those). The provider's receipt id is written by the
-- settle, so an index on the receipts would make every settle write all of them again
-- (migration 0021 removed exactly that); it goes to receipt_provider_ids instead, a row
-- written once by the receipts' event trigger, unless the receipt id or the idempotency
-- key already finds it. orch8.find_receipts(tenant, key) reads all three paths.

CREATE INDEX effect_receipts_idempotency_key_idx ON orch8.effect_receipts (
    tenant_id, idempotency_key
) WHERE idempotency_key <> id::text;

CREATE TABLE orch8.receipt_provider_ids (
    tenant_id text NOT NULL,
    provider_receipt_id text NOT NULL,
    receipt_id uuid NOT NULL,
    PRIMARY KEY (tenant_id, provider_receipt_id, receipt_id)
);

COMMENT ON TABLE orch8.receipt_provider_ids IS
'Which receipt a provider''s receipt id belongs to, one row per receipt and id, written '
'once by the trigger effect_receipts_record_event when a receipt gets a provider receipt '
'id that is neither its own id nor its idempotency key (those are found by the receipts'' '
'own indexes). Read by orch8.find_receipts.';
COMMENT ON COLUMN orch8.receipt_provider_ids.tenant_id IS 'The receipt''s tenant.';
COMMENT ON COLUMN orch8.receipt_provider_ids.provider_receipt_id IS
'The id the provider gave for the effect (effect_receipts.provider_receipt_id).';
COMMENT ON COLUMN orch8.receipt_provider_ids.receipt_id IS 'The receipt (effect_receipts.id).';

SELECT orch8.enable_tenant_isolation('orch8.receipt_provider_ids');
REVOKE ALL ON orch8.receipt_provider_ids FROM public;
GRANT SELECT ON orch8.receipt_provider_ids TO orch8_web, orch8_runner, orch8_auditor;
GRANT SELECT, INSERT ON orch8.receipt_provider_ids TO orch8_ledger;

CREATE TRIGGER receipt_provider_ids_append_only
BEFORE UPDATE OR DELETE ON orch8.receipt_provider_ids
FOR EACH ROW EXECUTE FUNCTION orch8.refuse_history_rewrite();

CREATE TRIGGER receipt_provider_ids_no_truncate
BEFORE TRUNCATE ON orch8.receipt_provider_ids
FOR EACH STATEMENT EXECUTE FUNCTION orch8.refuse_history_rewrite();

INSERT INTO orch8.receipt_provider_ids (tenant_id, provider_receipt_id, receipt_id)
SELECT
    r.tenant_id,
    r.provider_receipt_id,
    r.id
FROM orch8.effect_receipts AS r
WHERE
    r.provider_receipt_id IS NOT NULL
    AND r.provider_receipt_id NOT IN (r.id::text, coalesce(r.idempotency_key, ''));

CREATE OR REPLACE FUNCTION orch8.effect_receipts_record_event()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    IF tg_op = 'UPDATE' AND new.state = old.state THEN
        RETURN NULL;  -- not a transition (e.g. the no-op upsert in ensure_effect_receipt)
    END IF;
    -- a provider's receipt id that neither the receipt id nor its idempotency key
    -- already finds (receipt_provider_ids, written once: no index of the receipts names
    -- the column a settle writes)
    IF new.provider_receipt_id IS NOT NULL
       AND new.provider_receipt_id IS DISTINCT FROM
           (CASE WHEN tg_op = 'UPDATE' THEN old.provider_receipt_id END)
       AND new.provider_receipt_id NOT IN (new.id::text, coalesce(new.idempotency_key, '')) THEN
        INSERT INTO orch8.receipt_provider_ids (tenant_id, provider_receipt_id, receipt_id)
        VALUES (new.tenant_id, new.provider_receipt_id, new.id)
        ON CONFLICT DO NOTHING;
    END IF;
    -- the open set (dispatched or unknown) follows the state
    IF new.state IN ('dispatched', 'unknown')
       AND (tg_op = 'INSERT' OR old.state NOT IN ('dispatched', 'unknown')) THEN
        INSERT INTO orch8.open_receipts (tenant_id, receipt_id) VALUES (new.tenant_id, new.id)
        ON CONFLICT DO NOTHING;
    ELSIF tg_op = 'UPDATE' AND old.state IN ('dispatched', 'unknown')
          AND new.state NOT IN ('dispatched', 'unknown') THEN
        DELETE FROM orch8.open_receipts AS o
        WHERE o.tenant_id = new.tenant_id AND o.receipt_id = new.id;
    END IF;
    IF tg_op = 'INSERT' AND new.state = 'dispatched' THEN
        -- created dispatched: it took the path planned -> prepared -> dispatched
        INSERT INTO orch8.effect_receipt_events (
            tenant_id, receipt_id, from_state, to_state, actor, note, evidence, api_key_id
        )
        SELECT
            new.tenant_id, new.id, m.from_state, m.to_state,
            orch8.attributed_actor(current_setting('orch8.event_actor', true)),
            m.note,
            CASE WHEN m.n = 3
                 THEN nullif(current_setting('orch8.event_evidence', true), '')::jsonb END,
            orch8.current_key_id()
        FROM (VALUES
            (1, NULL::orch8.effect_state, 'planned'::orch8.effect_state, 'receipt planned'),
            (2, 'planned', 'prepared', NULL),
            (3, 'prepared', 'dispatched', nullif(current_setting('orch8.event_note', true), ''))
        ) AS m (n, from_state, to_state, note)
        ORDER BY m.n;
        RETURN NULL;
    END IF;
    INSERT INTO orch8.effect_receipt_events (
        tenant_id, receipt_id, from_state, to_state, actor, note, evidence, api_key_id
    ) VALUES (
        new.tenant_id,
        new.id,
        CASE WHEN tg_op = 'UPDATE' THEN old.state END,
        new.state,
        orch8.attributed_actor(current_setting('orch8.event_actor', true)),
        nullif(current_setting('orch8.event_note', true), ''),
        nullif(current_setting('orch8.event_evidence', true), '')::jsonb,
        orch8.current_key_id()
    );
    RETURN NULL;
END
$$;

COMMENT ON FUNCTION orch8.effect_receipts_record_event() IS
'Trigger: keeps orch8.open_receipts (the receipts dispatched or unknown) and '
'orch8.receipt_provider_ids (provider receipt ids to look receipts up by), and appends one '
'effect_receipt_events row per receipt creation and state move (a '
'receipt created dispatched gets three: planned, prepared, dispatched, in that order). '
'Note and evidence come from the transaction settings orch8.event_note and '
'orch8.event_evidence (set by the ledger functions; the note of a receipt created '
'dispatched goes on its dispatched event); the actor is attributed_actor('
'orch8.event_actor), db_user the login and api_key_id the sealed key.';
