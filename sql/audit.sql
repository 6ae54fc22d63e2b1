-- Operators' actions, recorded: a console calls pgq_audit in the same transaction as the
-- action it records (so a refused action records nothing); pgqueue.audit_log keeps them.

CREATE FUNCTION pgqueue.pgq_audit(action text, target text DEFAULT NULL, detail jsonb DEFAULT NULL,
                                  console_user text DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    id bigint;
BEGIN
    IF pgqueue._require(action, 'action') !~ '^[a-z][a-z0-9_]{0,62}$' THEN
        PERFORM pgqueue._invalid('action', pg_catalog.format(
            '%L is not an action name (1 to 63 lower-case letters, digits or _, starting with a letter)', action));
    END IF;
    INSERT INTO pgqueue.audit_log (db_role, console_user, action, target, detail)
    VALUES (session_user, console_user, action, target, detail)
    RETURNING audit_log.action_id INTO id;
    RETURN id;
END
$$;
