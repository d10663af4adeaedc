-- Repeatable: the history tables' months (docs/ARCHITECTURE.md, "History in monthly
-- partitions, and an archive that stays readable"; migration 0033). Which tables, keyed by
-- which column, is orch8.history_tables.

CREATE OR REPLACE FUNCTION orch8.history_month_bound(p_month date)
RETURNS uuid
LANGUAGE sql
IMMUTABLE
STRICT
PARALLEL SAFE
AS $$
    -- the smallest UUID whose first 48 bits are the month's first UTC millisecond
    SELECT (lpad(to_hex(floor(extract(EPOCH FROM p_month::timestamp) * 1000)::bigint), 12, '0')
            || repeat('0', 20))::uuid
$$;

COMMENT ON FUNCTION orch8.history_month_bound(date) IS
'The lower bound of the UTC month starting at p_month in the history tables'' key space: '
'the smallest UUID whose first 48 bits are that instant in Unix milliseconds. A '
'time-ordered id made in the month is at least this and less than the next month''s.';

CREATE OR REPLACE FUNCTION orch8.history_partition_name(p_table text, p_month date)
RETURNS text
LANGUAGE sql
IMMUTABLE
STRICT
PARALLEL SAFE
AS $$
    SELECT p_table || '_p' || to_char(p_month, 'YYYYMM')
$$;

COMMENT ON FUNCTION orch8.history_partition_name(text, date) IS
'The name of a history table''s partition for the month starting at p_month: '
'<table>_pYYYYMM.';

CREATE OR REPLACE FUNCTION orch8.attach_history_month(p_table text, p_key text, p_month date)
RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
    v_part text := orch8.history_partition_name(p_table, p_month);
    v_default text := p_table || '_default';
    v_lo uuid := orch8.history_month_bound(p_month);
    v_hi uuid := orch8.history_month_bound((p_month + interval '1 month')::date);
    v_options text[];
    v_moved bigint := 0;
    k record;
BEGIN
    SELECT c.reloptions INTO v_options FROM pg_class AS c
    WHERE c.oid = ('orch8.' || v_default)::regclass;
    EXECUTE format('CREATE TABLE orch8.%I (LIKE orch8.%I INCLUDING DEFAULTS INCLUDING '
                   'CONSTRAINTS INCLUDING STORAGE INCLUDING COMPRESSION)%s',
                   v_part, p_table,
                   CASE WHEN v_options IS NULL THEN ''
                        ELSE format(' WITH (%s)', array_to_string(v_options, ', ')) END);
    -- The parent's indexes under the month's name (attaching would build them anyway,
    -- named after their columns).
    FOR k IN
        SELECT c.relname AS name, pg_get_indexdef(x.indexrelid) AS def
        FROM pg_index AS x
        INNER JOIN pg_class AS c ON c.oid = x.indexrelid
        WHERE x.indrelid = ('orch8.' || p_table)::regclass
          AND NOT EXISTS (SELECT 1 FROM pg_constraint AS n WHERE n.conindid = x.indexrelid)
    LOOP
        EXECUTE replace(k.def, format('INDEX %s ON ONLY orch8.%s ', k.name, p_table),
                        format('INDEX %I ON orch8.%I ', v_part || substr(k.name, length(p_table) + 1),
                               v_part));
    END LOOP;
    -- The bound as a constraint first: attaching then need not scan the new table.
    EXECUTE format('ALTER TABLE orch8.%I ADD CONSTRAINT %I CHECK (%I >= %L AND %I < %L)',
                   v_part, v_part || '_month', p_key, v_lo, p_key, v_hi);
    BEGIN
        EXECUTE format('ALTER TABLE orch8.%I ATTACH PARTITION orch8.%I '
                       'FOR VALUES FROM (%L) TO (%L)', p_table, v_part, v_lo, v_hi);
    EXCEPTION WHEN check_violation THEN
        -- The default already holds rows of this month (ids that carry no time but fall
        -- in its range, or rows written while the month had no partition): PostgreSQL
        -- will not attach over them. They move first, the same rows one table over; the
        -- history triggers, which refuse any delete, are off on the default partition for
        -- this one statement, inside this transaction.
        EXECUTE format('ALTER TABLE orch8.%I DISABLE TRIGGER USER', v_default);
        EXECUTE format('WITH moved AS (DELETE FROM orch8.%I WHERE %I >= $1 AND %I < $2 '
                       'RETURNING *) INSERT INTO orch8.%I SELECT * FROM moved',
                       v_default, p_key, p_key, v_part)
        USING v_lo, v_hi;
        GET DIAGNOSTICS v_moved = ROW_COUNT;
        EXECUTE format('ALTER TABLE orch8.%I ENABLE TRIGGER USER', v_default);
        EXECUTE format('ALTER TABLE orch8.%I ATTACH PARTITION orch8.%I '
                       'FOR VALUES FROM (%L) TO (%L)', p_table, v_part, v_lo, v_hi);
    END;
    EXECUTE format('ALTER TABLE orch8.%I DROP CONSTRAINT %I', v_part, v_part || '_month');
    -- The default partition's own foreign keys (to instances and scopes) hold on every
    -- month too; NOT VALID as on the default: rows are checked as they are written.
    FOR k IN
        SELECT c.conname, pg_get_constraintdef(c.oid) AS def
        FROM pg_constraint AS c
        WHERE c.conrelid = ('orch8.' || v_default)::regclass AND c.contype = 'f'
          AND c.conparentid = 0
    LOOP
        EXECUTE format('ALTER TABLE orch8.%I ADD CONSTRAINT %I %s%s', v_part, k.conname,
                       k.def, CASE WHEN k.def LIKE '%NOT VALID' THEN '' ELSE ' NOT VALID' END);
    END LOOP;
    EXECUTE format('CREATE TRIGGER %I BEFORE TRUNCATE ON orch8.%I '
                   'FOR EACH STATEMENT EXECUTE FUNCTION orch8.refuse_history_rewrite()',
                   v_part || '_no_truncate', v_part);
    -- read through the parent only: its grants and its row-level security apply there
    EXECUTE format('REVOKE ALL ON orch8.%I FROM PUBLIC, orch8_web, orch8_runner, '
                   'orch8_auditor, orch8_ledger', v_part);
    EXECUTE format('ALTER TABLE orch8.%I ENABLE ROW LEVEL SECURITY', v_part);
    EXECUTE format('COMMENT ON TABLE orch8.%I IS %L', v_part,
                   format('The month %s of orch8.%s.', to_char(p_month, 'YYYY-MM'), p_table));
    RETURN v_moved;
END
$$;

COMMENT ON FUNCTION orch8.attach_history_month(text, text, date) IS
'Migrations and maintenance only: makes <table>_pYYYYMM for the UTC month starting at '
'p_month and attaches it to orch8.<table>, first moving into it any rows of that range '
'the default partition holds. Returns how many rows moved.';

CREATE OR REPLACE FUNCTION orch8.ensure_history_partitions(p_months_ahead integer DEFAULT 2)
RETURNS TABLE (table_name text, partition_name text, rows_moved bigint)
LANGUAGE plpgsql
AS $$
DECLARE
    v_first date := date_trunc('month', orch8.now() AT TIME ZONE 'UTC')::date;
    v_month date;
    h record;
BEGIN
    IF p_months_ahead IS NULL OR p_months_ahead NOT BETWEEN 0 AND 24 THEN
        RAISE EXCEPTION 'months ahead must be between 0 and 24, not %', p_months_ahead
            USING ERRCODE = 'O8008',
                  DETAIL = json_build_object('field', 'months_ahead',
                                             'value', p_months_ahead)::text;
    END IF;
    -- one maintainer at a time; the others find the months made and do nothing
    PERFORM pg_advisory_xact_lock(hashtext('orch8.ensure_history_partitions'));
    FOR i IN 0 .. p_months_ahead LOOP
        v_month := (v_first + make_interval(months => i))::date;
        FOR h IN SELECT * FROM orch8.history_tables ORDER BY position LOOP
            partition_name := orch8.history_partition_name(h.table_name, v_month);
            CONTINUE WHEN to_regclass('orch8.' || quote_ident(partition_name)) IS NOT NULL
                       OR to_regclass('orch8_archive.' || quote_ident(partition_name))
                          IS NOT NULL;
            table_name := h.table_name;
            rows_moved := orch8.attach_history_month(h.table_name, h.key_column, v_month);
            RETURN NEXT;
        END LOOP;
    END LOOP;
END
$$;

COMMENT ON FUNCTION orch8.ensure_history_partitions(integer) IS
'Makes the partitions of every history table (orch8.history_tables) for the current UTC '
'month and the p_months_ahead after it (0 to 24, default 2) that do not exist yet, and '
'returns one row per partition made (with the rows moved into it from the default). A '
'no-op when they exist. The runner calls it at start and hourly; `orch8 db migrate` and '
'`orch8 db history ensure` too. Runs as the tables'' owner.';

CREATE OR REPLACE FUNCTION orch8.archive_history_month(p_month date)
RETURNS TABLE (table_name text, partition_name text, row_count bigint)
LANGUAGE plpgsql
AS $$
DECLARE
    v_month date := date_trunc('month', p_month)::date;
    v_lo uuid := orch8.history_month_bound(v_month);
    v_hi uuid := orch8.history_month_bound((v_month + interval '1 month')::date);
    v_open_instances bigint;
    v_open_receipts bigint;
    h record;
BEGIN
    IF p_month IS NULL OR v_month >= date_trunc('month', orch8.now() AT TIME ZONE 'UTC')::date
    THEN
        RAISE EXCEPTION 'only a month that has ended can be archived, not %',
            coalesce(to_char(v_month, 'YYYY-MM'), 'NULL')
            USING ERRCODE = 'O8008',
                  DETAIL = json_build_object('field', 'month', 'value', p_month)::text;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtext('orch8.ensure_history_partitions'));
    IF to_regclass('orch8.' || orch8.history_partition_name('effect_receipts', v_month))
       IS NULL THEN
        RAISE EXCEPTION 'the month % has no partitions in the live tables (%)',
            to_char(v_month, 'YYYY-MM'),
            CASE WHEN to_regclass('orch8_archive.'
                                  || orch8.history_partition_name('effect_receipts', v_month))
                      IS NOT NULL THEN 'it is archived already'
                 ELSE 'its rows, if any, are in the default partitions' END
            USING ERRCODE = 'O8007',
                  DETAIL = json_build_object('month', to_char(v_month, 'YYYY-MM'))::text;
    END IF;
    -- Nothing in flight leaves: an instance of the month that has not ended, or a receipt
    -- of it that is not settled, keeps the month live.
    SELECT count(*) INTO v_open_instances FROM orch8.task_instances AS t
    WHERE t.id >= v_lo AND t.id < v_hi AND t.state NOT IN ('completed', 'failed', 'cancelled');
    SELECT count(*) INTO v_open_receipts FROM orch8.effect_receipts AS r
    WHERE r.id >= v_lo AND r.id < v_hi
      AND r.state IN ('planned', 'prepared', 'dispatched', 'unknown');
    IF v_open_instances > 0 OR v_open_receipts > 0 THEN
        RAISE EXCEPTION 'the month % is still in use: % instance(s) not ended, % receipt(s) '
                        'not settled', to_char(v_month, 'YYYY-MM'), v_open_instances,
                        v_open_receipts
            USING ERRCODE = 'O8010',
                  DETAIL = json_build_object('month', to_char(v_month, 'YYYY-MM'),
                                             'open_instances', v_open_instances,
                                             'open_receipts', v_open_receipts)::text,
                  HINT = 'end or resolve them first (orch8 effects unresolved)';
    END IF;
    FOR h IN SELECT * FROM orch8.history_tables ORDER BY position LOOP
        table_name := h.table_name;
        partition_name := orch8.history_partition_name(h.table_name, v_month);
        EXECUTE format('SELECT count(*) FROM orch8.%I', partition_name) INTO row_count;
        EXECUTE format('ALTER TABLE orch8.%I DETACH PARTITION orch8.%I',
                       h.table_name, partition_name);
        EXECUTE format('ALTER TABLE orch8.%I SET SCHEMA orch8_archive', partition_name);
        EXECUTE format('ALTER TABLE orch8_archive.%I ADD CONSTRAINT %I '
                       'CHECK (%I >= %L AND %I < %L)', partition_name,
                       partition_name || '_month', h.key_column, v_lo, h.key_column, v_hi);
        EXECUTE format('ALTER TABLE orch8_archive.%I ATTACH PARTITION orch8_archive.%I '
                       'FOR VALUES FROM (%L) TO (%L)', h.table_name, partition_name,
                       v_lo, v_hi);
        EXECUTE format('ALTER TABLE orch8_archive.%I DROP CONSTRAINT %I', partition_name,
                       partition_name || '_month');
        RETURN NEXT;
    END LOOP;
END
$$;

COMMENT ON FUNCTION orch8.archive_history_month(date) IS
'Moves one ended UTC month of every history table from the live tables to schema '
'orch8_archive (a detach and an attach: no row is copied), and returns each partition '
'with its row count. Refuses (O8010) while an instance created in the month has not '
'ended or a receipt of it is not settled; O8007 when the month has no live partition. '
'Archived receipts stay readable: orch8.find_receipts reads the archive too.';

CREATE OR REPLACE FUNCTION orch8.history_partitions()
RETURNS TABLE (
    table_name text, partition_name text, archived boolean, month date, row_estimate bigint,
    total_bytes bigint
)
LANGUAGE plpgsql
STABLE
AS $$
BEGIN
    RETURN QUERY
    SELECT
        h.table_name,
        c.relname::text,
        n.nspname = 'orch8_archive',
        CASE WHEN c.relname ~ '_p[0-9]{6}$'
             THEN to_date(right(c.relname, 6), 'YYYYMM') END,
        greatest(c.reltuples, 0)::bigint,
        pg_total_relation_size(c.oid)
    FROM orch8.history_tables AS h
    INNER JOIN pg_namespace AS n ON n.nspname IN ('orch8', 'orch8_archive')
    INNER JOIN pg_class AS p ON p.relnamespace = n.oid AND p.relname = h.table_name
    INNER JOIN pg_inherits AS i ON i.inhparent = p.oid
    INNER JOIN pg_class AS c ON c.oid = i.inhrelid
    ORDER BY h.position, n.nspname, c.relname;
END
$$;

COMMENT ON FUNCTION orch8.history_partitions() IS
'Every partition of the history tables, live and archived: its month (NULL for the '
'default partition), the planner''s row estimate and its size on disk with indexes.';
