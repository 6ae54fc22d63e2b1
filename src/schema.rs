//! The extension's tables, constraints and indexes: all of it lives in `sql/schema.sql`.

pgrx::extension_sql_file!("../sql/schema.sql", name = "schema", bootstrap);
