//! The extension's SQL, in the order it is installed: the schema (tables, indexes, roles),
//! the argument checks every API function shares, one file per API family (the operators'
//! audit last), the metrics views, their descriptions (COMMENT ON), and finally the privileges. Upgrade scripts are in
//! `sql/upgrade/`, earlier releases' full scripts in `sql/install/` (scripts/install.sh).

pgrx::extension_sql_file!("../sql/schema.sql", name = "schema", bootstrap);
pgrx::extension_sql_file!("../sql/errors.sql", name = "errors", requires = ["schema"]);
pgrx::extension_sql_file!("../sql/queues.sql", name = "queues", requires = ["errors"]);
pgrx::extension_sql_file!("../sql/send.sql", name = "send", requires = ["queues"]);
pgrx::extension_sql_file!("../sql/dependencies.sql", name = "dependencies", requires = ["send"]);
pgrx::extension_sql_file!(
    "../sql/claim.sql",
    name = "claim",
    requires = ["dependencies", held::_claims_written, held::_held_forget]
);
pgrx::extension_sql_file!("../sql/finish.sql", name = "finish", requires = ["claim"]);
pgrx::extension_sql_file!("../sql/park.sql", name = "park", requires = ["finish"]);
pgrx::extension_sql_file!("../sql/schedule.sql", name = "schedule", requires = ["park"]);
pgrx::extension_sql_file!("../sql/maintenance.sql", name = "maintenance", requires = ["schedule", held::_held_renew]);
pgrx::extension_sql_file!("../sql/audit.sql", name = "audit", requires = ["maintenance"]);
pgrx::extension_sql_file!(
    "../sql/stats.sql",
    name = "stats",
    requires = [
        "audit",
        reconcile::_queue_depth,
        reconcile::_dead_letters,
        queue_state::_shared_state,
        held::_held_set,
        schedule::_local_time,
        ledger::_claim_token
    ]
);
pgrx::extension_sql_file!(
    "../sql/comments.sql",
    name = "comments",
    requires = ["stats", claim::pgq_claim, claim::pgq_ack_claim_reporting, tick::pgq_tick, pgq_version]
);
pgrx::extension_sql_file!("../sql/privileges.sql", name = "privileges", finalize);
