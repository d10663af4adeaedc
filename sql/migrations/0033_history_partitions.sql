-- 0033: the history tables become partitioned by month, with an archive beside them
-- (docs/ARCHITECTURE.md, "History in monthly partitions, and an archive that stays
-- readable"). Each table is recreated as a parent partitioned by range on the id its
-- primary key already holds, and the old table becomes its default partition as it is:
-- no row is copied. The months themselves are made by orch8.ensure_history_partitions
-- (sql/functions/history.sql), which `orch8 db migrate` calls after this file.

-- Which tables, keyed by which column: the one list the functions read -------------------

CREATE TABLE orch8.history_tables (
    table_name text PRIMARY KEY,
    key_column text NOT NULL,
    position integer NOT NULL UNIQUE
);

COMMENT ON TABLE orch8.history_tables IS
'The history tables partitioned by month: each is range-partitioned on key_column (a '
'time-ordered id), with a default partition <table>_default and one partition per UTC '
'month <table>_pYYYYMM; an archived month lives in schema orch8_archive.';
COMMENT ON COLUMN orch8.history_tables.table_name IS 'The table in schema orch8.';
COMMENT ON COLUMN orch8.history_tables.key_column IS
'Its partition key: a receipt id or an instance id, whose first 48 bits are the Unix '
'milliseconds of the instance''s creation when the id is time-ordered.';
COMMENT ON COLUMN orch8.history_tables.position IS 'The order the functions visit them in.';

INSERT INTO orch8.history_tables (table_name, key_column, position) VALUES
('effect_receipts', 'id', 1),
('effect_receipt_events', 'receipt_id', 2),
('block_outputs', 'instance_id', 3),
('instance_transitions', 'instance_id', 4);

GRANT SELECT ON orch8.history_tables TO orch8_web, orch8_runner, orch8_auditor;

-- A function the runner may call that runs as the tables' owner -------------------------

ALTER TABLE orch8.function_access DROP CONSTRAINT function_access_access_check;
ALTER TABLE orch8.function_access ADD CONSTRAINT function_access_access_check
CHECK (access IN ('web', 'all_tenants', 'private', 'migration', 'maintenance'));

COMMENT ON COLUMN orch8.function_access.access IS
'Its exception to the default privileges that orch8.secure_functions() applies: web (the '
'web role may call this writer), all_tenants (a cross-tenant read owned by orch8_runner), '
'private (a helper only the engine''s own functions call), migration (left to the '
'migrating login) or maintenance (owned by the history tables'' owner, SECURITY DEFINER, and '
'callable by orch8_runner: catalog work such as making next month''s partitions).';

INSERT INTO orch8.function_access (name, access) VALUES
('ensure_history_partitions', 'maintenance'),
('attach_history_month', 'migration'),
('archive_history_month', 'migration'),
('require_effect_receipt', 'private');

CREATE OR REPLACE FUNCTION orch8.secure_functions()
RETURNS integer
LANGUAGE plpgsql
AS $$
DECLARE
    v_fn record;
    v_owner text;
    v_count integer := 0;
    v_tables_owner text := (SELECT pg_get_userbyid(c.relowner) FROM pg_class AS c
                            WHERE c.oid = 'orch8.history_tables'::regclass);
BEGIN
    -- A new owner needs CREATE on the schema; neither keeps it (a role that can create
    -- functions here could shadow ours on the definers' search_path).
    GRANT CREATE ON SCHEMA orch8 TO orch8_ledger, orch8_runner;
    FOR v_fn IN
        SELECT p.oid::regprocedure AS sig, p.provolatile, p.prosecdef,
               pg_get_userbyid(p.proowner) AS owner,
               coalesce(a.access, 'default') AS access,
               coalesce(p.proconfig, '{}') AS config
        FROM pg_proc AS p
        LEFT JOIN orch8.function_access AS a ON a.name = p.proname
        WHERE p.pronamespace = 'orch8'::regnamespace AND p.prokind = 'f'
    LOOP
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC, orch8_web, orch8_runner, '
                       'orch8_auditor', v_fn.sig);
        CONTINUE WHEN v_fn.access = 'migration';
        IF v_fn.access = 'maintenance' THEN
            -- the history tables' owner (who made them) runs it: only the owner of a
            -- partitioned table may give it partitions
            IF v_fn.owner <> v_tables_owner THEN
                EXECUTE format('ALTER FUNCTION %s OWNER TO %I', v_fn.sig, v_tables_owner);
            END IF;
            IF NOT (v_fn.prosecdef
                    AND 'search_path=pg_catalog, orch8, pg_temp' = ANY (v_fn.config)) THEN
                EXECUTE format('ALTER FUNCTION %s SECURITY DEFINER '
                               'SET search_path = pg_catalog, orch8, pg_temp', v_fn.sig);
            END IF;
            EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO orch8_runner', v_fn.sig);
            v_count := v_count + 1;
            CONTINUE;
        END IF;
        v_owner := CASE v_fn.access WHEN 'all_tenants' THEN 'orch8_runner' ELSE 'orch8_ledger' END;
        IF v_fn.owner <> v_owner THEN
            EXECUTE format('ALTER FUNCTION %s OWNER TO %I', v_fn.sig, v_owner);
        END IF;
        -- Writers run as the ledger; so do the few readers declared DEFINER (the seal).
        -- Plain readers stay INVOKER: inlinable, and confined by the caller's own policies.
        -- Private helpers stay INVOKER too: only a definer (already the ledger, with the
        -- fixed search_path) or the ledger's members can call them, and entering a definer
        -- in every nested call costs a guarded step about a tenth of its time.
        IF (v_fn.provolatile = 'v' AND v_fn.access <> 'private' OR v_fn.prosecdef)
           AND NOT (v_fn.prosecdef
                    AND 'search_path=pg_catalog, orch8, pg_temp' = ANY (v_fn.config)) THEN
            EXECUTE format('ALTER FUNCTION %s SECURITY DEFINER '
                           'SET search_path = pg_catalog, orch8, pg_temp', v_fn.sig);
        END IF;
        CONTINUE WHEN v_fn.access = 'private';
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO orch8_runner', v_fn.sig);
        IF v_fn.provolatile <> 'v' OR v_fn.access IN ('web', 'all_tenants') THEN
            EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO orch8_web', v_fn.sig);
        END IF;
        IF v_fn.provolatile <> 'v' THEN
            EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO orch8_auditor', v_fn.sig);
        END IF;
        v_count := v_count + 1;
    END LOOP;
    REVOKE CREATE ON SCHEMA orch8 FROM orch8_ledger, orch8_runner;
    RETURN v_count;
END
$$;

COMMENT ON FUNCTION orch8.secure_functions() IS
'Migrations only (the migrator runs it after applying function files, since CREATE OR '
'REPLACE resets these): every function of the schema is owned by orch8_ledger (the '
'all_tenants ones by orch8_runner, the maintenance ones by the history tables'' owner), '
'writers that application roles may call are SECURITY DEFINER with search_path '
'pg_catalog, orch8, pg_temp (private helpers run inside them), and EXECUTE follows '
'orch8.function_access. Returns how many functions application roles may call.';

-- A verification or a worker task names a receipt that exists ---------------------------
-- PostgreSQL checks a foreign key to a partitioned table per partition, so moving a
-- receipt from the default partition into its month would break the key although the
-- receipt still exists. A receipt is never deleted (its guard refuses), so what the keys
-- gave is checked on insert and on a change of the reference instead.

CREATE FUNCTION orch8.require_effect_receipt()
RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM 1 FROM orch8.effect_receipts AS r
    WHERE r.tenant_id = NEW.tenant_id AND r.id = NEW.effect_id
    FOR KEY SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'insert or update on table "%" names receipt % that does not exist',
            TG_TABLE_NAME, NEW.effect_id
            USING ERRCODE = 'foreign_key_violation',
                  DETAIL = json_build_object('tenant_id', NEW.tenant_id,
                                             'effect_id', NEW.effect_id)::text;
    END IF;
    RETURN NEW;
END
$$;

COMMENT ON FUNCTION orch8.require_effect_receipt() IS
'Trigger on effect_verifications and worker_tasks: the receipt a row names (tenant_id, '
'effect_id) exists, else foreign_key_violation. Takes the key-share lock a foreign key '
'would. It replaces their foreign keys since effect_receipts is partitioned (migration '
'0033).';

ALTER TABLE orch8.effect_verifications
DROP CONSTRAINT effect_verifications_tenant_id_effect_id_fkey;
ALTER TABLE orch8.worker_tasks
DROP CONSTRAINT worker_tasks_tenant_id_effect_id_fkey;

CREATE TRIGGER effect_verifications_receipt
BEFORE INSERT OR UPDATE OF tenant_id, effect_id ON orch8.effect_verifications
FOR EACH ROW EXECUTE FUNCTION orch8.require_effect_receipt();

CREATE TRIGGER worker_tasks_receipt
BEFORE INSERT OR UPDATE OF tenant_id, effect_id ON orch8.worker_tasks
FOR EACH ROW WHEN (new.effect_id IS NOT NULL)
EXECUTE FUNCTION orch8.require_effect_receipt();

-- Save and drop what is bound to the tables themselves ---------------------------------
-- Views over them, and functions whose arguments or result are their row types, name the
-- old table by its oid; they would follow it into the default partition. The views are
-- made again below from their saved definitions; the functions by the migrator, which
-- applies every function file again after this migration (the repeatable rows go).

CREATE TEMPORARY TABLE saved_views ON COMMIT DROP AS
WITH RECURSIVE deps AS (
    SELECT DISTINCT r.ev_class AS view_oid
    FROM pg_depend AS d
    INNER JOIN pg_rewrite AS r ON d.objid = r.oid
    WHERE
        d.classid = 'pg_rewrite'::regclass
        AND d.refobjid IN (
            SELECT ('orch8.' || h.table_name)::regclass FROM orch8.history_tables AS h
        )
        AND r.ev_class <> d.refobjid
    UNION
    SELECT r.ev_class
    FROM deps
    INNER JOIN pg_depend AS d ON deps.view_oid = d.refobjid AND d.classid = 'pg_rewrite'::regclass
    INNER JOIN pg_rewrite AS r ON d.objid = r.oid
    WHERE r.ev_class <> deps.view_oid
)

SELECT
    c.oid AS view_oid,
    c.oid::regclass::text AS view_name,
    pg_get_viewdef(c.oid) AS definition,
    c.reloptions,
    pg_get_userbyid(c.relowner) AS owner,
    c.relacl,
    obj_description(c.oid, 'pg_class') AS view_comment,
    (
        SELECT coalesce(jsonb_object_agg(a.attname, col_description(c.oid, a.attnum)), '{}')
        FROM pg_attribute AS a
        WHERE a.attrelid = c.oid AND a.attnum > 0 AND col_description(c.oid, a.attnum) IS NOT NULL
    ) AS column_comments
FROM pg_class AS c
WHERE c.oid IN (SELECT deps.view_oid FROM deps);

DO $$
DECLARE
    v record;
BEGIN
    -- newest first, so a view over another view goes before it; no CASCADE, so anything
    -- else that depends on a view stops the migration instead of vanishing
    FOR v IN SELECT view_name FROM saved_views ORDER BY view_oid DESC LOOP
        EXECUTE format('DROP VIEW %s', v.view_name);
    END LOOP;
    FOR v IN
        SELECT p.oid::regprocedure AS sig
        FROM pg_proc AS p
        WHERE p.pronamespace = 'orch8'::regnamespace
          AND EXISTS (
              SELECT 1 FROM orch8.history_tables AS h
              INNER JOIN pg_class AS c ON c.oid = ('orch8.' || h.table_name)::regclass
              WHERE c.reltype = p.prorettype OR c.reltype = ANY (p.proargtypes)
          )
    LOOP
        EXECUTE format('DROP FUNCTION %s', v.sig);
    END LOOP;
END
$$;

DELETE FROM orch8.schema_migrations
WHERE kind = 'repeatable';

-- Each table becomes a parent, the old one its default partition ------------------------

DO $$
DECLARE
    h record;
    v_old regclass;
    v_default text;
    v_comment text;
    v_acl aclitem[];
    v_triggers text[];
    v_indexes text[];
    v_pkey text;
    v_stmt text;
    v_identities jsonb;
    v_next bigint;
    g record;
    i record;
BEGIN
    FOR h IN SELECT * FROM orch8.history_tables ORDER BY position LOOP
        v_old := ('orch8.' || h.table_name)::regclass;
        v_default := h.table_name || '_default';
        SELECT obj_description(c.oid, 'pg_class'), c.relacl INTO v_comment, v_acl
        FROM pg_class AS c WHERE c.oid = v_old;
        -- definitions as they read now, naming orch8.<table>: they are made on the parent
        SELECT coalesce(array_agg(pg_get_triggerdef(t.oid) ORDER BY t.tgname), '{}')
        INTO v_triggers
        FROM pg_trigger AS t WHERE t.tgrelid = v_old AND NOT t.tgisinternal;
        SELECT coalesce(array_agg(pg_get_indexdef(x.indexrelid) ORDER BY x.indexrelid), '{}')
        INTO v_indexes
        FROM pg_index AS x
        WHERE x.indrelid = v_old
          AND NOT EXISTS (SELECT 1 FROM pg_constraint AS k WHERE k.conindid = x.indexrelid);
        SELECT pg_get_constraintdef(k.oid) INTO STRICT v_pkey
        FROM pg_constraint AS k WHERE k.conrelid = v_old AND k.contype = 'p';

        -- PostgreSQL 15 has no identity columns on a partitioned table: each becomes a
        -- sequence default on the parent, continuing where the identity stopped.
        v_identities := '{}';
        FOR i IN SELECT a.attname, pg_get_serial_sequence(v_old::text, a.attname) AS seq
                 FROM pg_attribute AS a WHERE a.attrelid = v_old AND a.attidentity <> '' LOOP
            EXECUTE format('SELECT CASE WHEN is_called THEN last_value + 1 ELSE last_value END '
                           'FROM %s', i.seq) INTO v_next;
            EXECUTE format('ALTER TABLE %s ALTER COLUMN %I DROP IDENTITY', v_old, i.attname);
            v_identities := v_identities || jsonb_build_object(i.attname, v_next);
        END LOOP;
        FOR i IN SELECT t.tgname FROM pg_trigger AS t
                 WHERE t.tgrelid = v_old AND NOT t.tgisinternal LOOP
            EXECUTE format('DROP TRIGGER %I ON %s', i.tgname, v_old);
        END LOOP;
        FOR i IN SELECT p.polname FROM pg_policy AS p WHERE p.polrelid = v_old LOOP
            EXECUTE format('DROP POLICY %I ON %s', i.polname, v_old);
        END LOOP;
        EXECUTE format('ALTER TABLE %s RENAME TO %I', v_old, v_default);
        EXECUTE format('ALTER TABLE orch8.%I RENAME CONSTRAINT %I TO %I', v_default,
                       h.table_name || '_pkey', v_default || '_pkey');
        FOR i IN SELECT c.relname FROM pg_index AS x
                 INNER JOIN pg_class AS c ON c.oid = x.indexrelid
                 WHERE x.indrelid = v_old
                   AND NOT EXISTS (SELECT 1 FROM pg_constraint AS k
                                   WHERE k.conindid = x.indexrelid) LOOP
            EXECUTE format('ALTER INDEX orch8.%I RENAME TO %I', i.relname,
                           v_default || substr(i.relname, length(h.table_name) + 1));
        END LOOP;

        EXECUTE format(
            'CREATE TABLE orch8.%I (LIKE orch8.%I INCLUDING DEFAULTS INCLUDING CONSTRAINTS '
            'INCLUDING COMMENTS INCLUDING STORAGE INCLUDING COMPRESSION) '
            'PARTITION BY RANGE (%I)', h.table_name, v_default, h.key_column);
        EXECUTE format('ALTER TABLE orch8.%I ADD CONSTRAINT %I %s', h.table_name,
                       h.table_name || '_pkey', v_pkey);
        FOR i IN SELECT * FROM jsonb_each_text(v_identities) LOOP
            EXECUTE format('CREATE SEQUENCE orch8.%I AS bigint START WITH %s OWNED BY orch8.%I.%I',
                           h.table_name || '_' || i.key || '_seq', i.value, h.table_name, i.key);
            EXECUTE format('ALTER TABLE orch8.%I ALTER COLUMN %I SET DEFAULT nextval(%L)',
                           h.table_name, i.key, 'orch8.' || h.table_name || '_' || i.key || '_seq');
            -- a default's nextval needs USAGE, which an identity did not: the writers get it
            -- whoever migrates (default privileges are per creating role)
            EXECUTE format('GRANT USAGE, SELECT ON SEQUENCE orch8.%I TO orch8_ledger',
                           h.table_name || '_' || i.key || '_seq');
        END LOOP;
        FOREACH v_stmt IN ARRAY v_indexes LOOP
            EXECUTE v_stmt;
        END LOOP;
        -- its indexes match the parent's, so attaching builds nothing, and nothing is
        -- scanned: there is no other partition yet
        EXECUTE format('ALTER TABLE orch8.%I ATTACH PARTITION orch8.%I DEFAULT',
                       h.table_name, v_default);
        FOREACH v_stmt IN ARRAY v_triggers LOOP
            EXECUTE v_stmt;
        END LOOP;

        PERFORM orch8.enable_tenant_isolation(('orch8.' || h.table_name)::regclass);
        -- exactly the old grants on the parent; a partition is read through its parent,
        -- so the application roles get nothing on it (row-level security stays on it too)
        FOR g IN SELECT DISTINCT a.grantee FROM pg_class AS c, aclexplode(c.relacl) AS a
                 WHERE c.oid = ('orch8.' || h.table_name)::regclass LOOP
            EXECUTE format('REVOKE ALL ON orch8.%I FROM %s', h.table_name,
                           CASE WHEN g.grantee = 0 THEN 'PUBLIC'
                                ELSE quote_ident(pg_get_userbyid(g.grantee)) END);
        END LOOP;
        FOR g IN SELECT * FROM aclexplode(v_acl) LOOP
            EXECUTE format('GRANT %s ON orch8.%I TO %s%s', g.privilege_type, h.table_name,
                           CASE WHEN g.grantee = 0 THEN 'PUBLIC'
                                ELSE quote_ident(pg_get_userbyid(g.grantee)) END,
                           CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
        END LOOP;
        EXECUTE format('REVOKE ALL ON orch8.%I FROM PUBLIC, orch8_web, orch8_runner, '
                       'orch8_auditor, orch8_ledger', v_default);
        EXECUTE format('COMMENT ON TABLE orch8.%I IS %L', h.table_name,
                       v_comment || ' Partitioned by month on ' || h.key_column
                       || ' (orch8.history_tables).');
        EXECUTE format('COMMENT ON TABLE orch8.%I IS %L', v_default,
                       'The default partition of orch8.' || h.table_name || ': rows whose '
                       || h.key_column || ' falls in no month partition (ids that carry '
                       || 'no time, and the history written before migration 0033).');
    END LOOP;
END
$$;

-- The views again, as they were ----------------------------------------------------------

DO $$
DECLARE
    v record;
    g record;
    col record;
BEGIN
    FOR v IN SELECT * FROM saved_views ORDER BY view_oid LOOP
        EXECUTE format('CREATE VIEW %s%s AS %s', v.view_name,
                       CASE WHEN v.reloptions IS NULL THEN ''
                            ELSE format(' WITH (%s)', array_to_string(v.reloptions, ', ')) END,
                       v.definition);
        EXECUTE format('ALTER VIEW %s OWNER TO %I', v.view_name, v.owner);
        FOR g IN
            SELECT DISTINCT grantee FROM aclexplode(
                (SELECT relacl FROM pg_class WHERE oid = v.view_name::regclass)
            )
        LOOP
            EXECUTE format('REVOKE ALL ON %s FROM %s', v.view_name,
                           CASE WHEN g.grantee = 0 THEN 'PUBLIC'
                                ELSE quote_ident(pg_get_userbyid(g.grantee)) END);
        END LOOP;
        FOR g IN SELECT * FROM aclexplode(v.relacl) LOOP
            EXECUTE format('GRANT %s ON %s TO %s%s', g.privilege_type, v.view_name,
                           CASE WHEN g.grantee = 0 THEN 'PUBLIC'
                                ELSE quote_ident(pg_get_userbyid(g.grantee)) END,
                           CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
        END LOOP;
        EXECUTE format('COMMENT ON VIEW %s IS %L', v.view_name, v.view_comment);
        FOR col IN SELECT * FROM jsonb_each_text(v.column_comments) LOOP
            EXECUTE format('COMMENT ON COLUMN %s.%I IS %L', v.view_name, col.key, col.value);
        END LOOP;
    END LOOP;
END
$$;

-- The archive: the same tables, read-only, in their own schema --------------------------

CREATE SCHEMA orch8_archive;

COMMENT ON SCHEMA orch8_archive IS
'Archived months of the history tables (orch8.archive_history_month): the same columns, '
'partitioned the same way, read-only. Readable as the live tables are; a month leaves '
'the database only by an operator''s pg_dump, DETACH and DROP (docs/STORAGE.md).';

GRANT USAGE ON SCHEMA orch8_archive TO orch8_web, orch8_runner, orch8_auditor, orch8_ledger;

DO $$
DECLARE
    h record;
BEGIN
    FOR h IN SELECT * FROM orch8.history_tables ORDER BY position LOOP
        EXECUTE format(
            'CREATE TABLE orch8_archive.%I (LIKE orch8.%I INCLUDING CONSTRAINTS '
            'INCLUDING COMMENTS INCLUDING INDEXES INCLUDING STORAGE INCLUDING COMPRESSION) '
            'PARTITION BY RANGE (%I)', h.table_name, h.table_name, h.key_column);
        EXECUTE format('COMMENT ON TABLE orch8_archive.%I IS %L', h.table_name,
                       'Archived months of orch8.' || h.table_name
                       || ': read-only (orch8.archive_history_month).');
        EXECUTE format('CREATE TRIGGER %I BEFORE INSERT OR UPDATE OR DELETE '
                       'ON orch8_archive.%I FOR EACH ROW '
                       'EXECUTE FUNCTION orch8.refuse_history_rewrite()',
                       h.table_name || '_read_only', h.table_name);
        EXECUTE format('CREATE TRIGGER %I BEFORE TRUNCATE ON orch8_archive.%I '
                       'FOR EACH STATEMENT EXECUTE FUNCTION orch8.refuse_history_rewrite()',
                       h.table_name || '_no_truncate', h.table_name);
        PERFORM orch8.enable_tenant_isolation(('orch8_archive.' || h.table_name)::regclass);
        EXECUTE format('GRANT SELECT ON orch8_archive.%I '
                       'TO orch8_web, orch8_runner, orch8_auditor, orch8_ledger',
                       h.table_name);
    END LOOP;
END
$$;
