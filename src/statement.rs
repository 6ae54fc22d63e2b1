//! Statements the hot paths (claim, ack) run through SPI, each prepared once per process and
//! kept: no interpreter, no re-parsing, and always the generic plan (the same whatever the
//! arguments; left to choose, PostgreSQL would plan some of them anew on every call, which
//! costs more than running them). PostgreSQL re-plans a kept statement itself when what it
//! reads changes (an index added, the extension re-created).

use pgrx::pg_sys;
use pgrx::prelude::*;
use std::cell::RefCell;
use std::ffi::CStr;

/// Whether this database's pgqueue tables have `table.column`: the library runs the previous
/// release's SQL until ALTER EXTENSION UPDATE, and picks its statements' text by what the
/// tables have. Catalog cache lookups, no query.
pub fn has_column(table: &CStr, column: &CStr) -> bool {
    // SAFETY: catalog cache lookups of NUL-terminated names, inside a transaction.
    unsafe {
        let schema = pg_sys::get_namespace_oid(c"pgqueue".as_ptr(), true);
        let relation = pg_sys::get_relname_relid(table.as_ptr(), schema);
        relation != pg_sys::InvalidOid && pg_sys::get_attnum(relation, column.as_ptr()) > 0
    }
}

/// Whether the extension's schema has a table or view `name` (a catalog cache lookup).
pub fn has_relation(name: &CStr) -> bool {
    // SAFETY: catalog cache lookups of NUL-terminated names, inside a transaction.
    unsafe {
        let schema = pg_sys::get_namespace_oid(c"pgqueue".as_ptr(), true);
        pg_sys::get_relname_relid(name.as_ptr(), schema) != pg_sys::InvalidOid
    }
}

/// A statement's text put together by `concat!` (ending in `\0`), as a `CStr`, at compile
/// time: for statements that differ by layout (finish.rs, claim.rs).
pub const fn text(sql: &'static str) -> &'static CStr {
    match CStr::from_bytes_with_nul(sql.as_bytes()) {
        Ok(sql) => sql,
        Err(_) => panic!("a statement's text has a NUL, or does not end in one"),
    }
}

/// A statement on the hot table in both layouts: `pgqueue.message_rows` (0.20.0 on), or
/// `pgqueue.messages` (the table itself until ALTER EXTENSION UPDATE from 0.19 or earlier).
/// The library names the table, not the view `pgqueue.messages` over it, so that the view can
/// show more than the table's rows (docs/design/write-path.md, step 3b).
pub struct OnRows {
    pub rows: Statement,
    pub table: Statement,
}

impl OnRows {
    /// The statement for this database's layout (a catalog cache lookup).
    pub fn get(&self) -> &Statement {
        if has_message_rows() { &self.rows } else { &self.table }
    }
}

/// Whether the hot table is `pgqueue.message_rows` (0.20.0 on), not `pgqueue.messages`.
pub fn has_message_rows() -> bool {
    has_relation(c"message_rows")
}

/// Whether finished messages go to `pgqueue.history_rows` (0.26.0 on), the table behind the
/// view `pgqueue.history`, not to the table `pgqueue.history`.
pub fn has_history_rows() -> bool {
    has_relation(c"history_rows")
}

/// `on_rows!(args; "SELECT … FROM ", ROWS, " m …")`: an `OnRows` whose text names the hot
/// table wherever `ROWS` stands.
#[macro_export]
macro_rules! on_rows {
    ($args:expr; $($part:tt),+ $(,)?) => {
        $crate::statement::OnRows {
            rows: $crate::statement::Statement {
                sql: $crate::statement::text(concat!($($crate::on_rows!(@part "pgqueue.message_rows", $part)),+, "\0")),
                args: $args,
            },
            table: $crate::statement::Statement {
                sql: $crate::statement::text(concat!($($crate::on_rows!(@part "pgqueue.messages", $part)),+, "\0")),
                args: $args,
            },
        }
    };
    (@part $table:literal, ROWS) => { $table };
    (@part $table:literal, $text:literal) => { $text };
}

/// A statement and its argument types; a `static`, whose address names its kept plan.
pub struct Statement {
    pub sql: &'static CStr,
    pub args: &'static [pg_sys::Oid],
}

thread_local! {
    /// Kept plans, by the address of their statement's text.
    static KEPT: RefCell<Vec<(usize, pg_sys::SPIPlanPtr)>> = const { RefCell::new(Vec::new()) };
}

impl Statement {
    fn plan(&self) -> pg_sys::SPIPlanPtr {
        let key = self.sql.as_ptr() as usize;
        if let Some(plan) = KEPT.with_borrow(|kept| kept.iter().find(|(k, _)| *k == key).map(|(_, p)| *p)) {
            return plan;
        }
        // SAFETY: inside an SPI connection (run's caller); the text and types outlive the call.
        let plan = unsafe {
            pg_sys::SPI_prepare_cursor(
                self.sql.as_ptr(),
                self.args.len() as i32,
                self.args.as_ptr().cast_mut(),
                pg_sys::CURSOR_OPT_GENERIC_PLAN as i32,
            )
        };
        if plan.is_null() {
            error!("pgqueue: could not prepare a statement: SPI error {}", unsafe { pg_sys::SPI_result });
        }
        // SAFETY: a plan SPI_prepare_cursor just made; kept for the life of the process.
        unsafe { pg_sys::SPI_keepplan(plan) };
        KEPT.with_borrow_mut(|kept| kept.push((key, plan)));
        plan
    }

    /// Runs the statement with `args` (None: NULL), inside an SPI connection, with a new
    /// snapshot (as any statement of a volatile function).
    pub fn run(&self, args: &[Option<pg_sys::Datum>]) -> Rows {
        self.run_in(args, false)
    }

    /// As `run`, reading (a SELECT) in a snapshot taken now whatever the isolation level: what
    /// committed after the transaction's snapshot is seen, as a foreign key check sees it.
    /// For a claim asking who holds the rows it has locked: whoever did committed before.
    pub fn run_latest(&self, args: &[Option<pg_sys::Datum>]) -> Rows {
        self.run_in(args, true)
    }

    fn run_in(&self, args: &[Option<pg_sys::Datum>], latest: bool) -> Rows {
        debug_assert_eq!(args.len(), self.args.len());
        let plan = self.plan();
        let mut values: Vec<pg_sys::Datum> = args.iter().map(|a| a.unwrap_or(pg_sys::Datum::from(0))).collect();
        let nulls: Vec<std::ffi::c_char> = args.iter().map(|a| if a.is_some() { b' ' } else { b'n' } as _).collect();
        // Never JIT-compiled: a kept plan that crosses jit_above_cost (a table grown big for
        // a while, a pinned horizon) would be compiled anew at every run of a hot path,
        // which costs far more than the run (pgq_claim and pgq_ack_claim set jit = off for
        // the same reason). Planning and re-planning happen inside the execution.
        let _no_jit = SetFor::new(&raw mut pg_sys::jit_enabled, false);
        // Nor planned with sequential scans: a kept plan made while a table was empty (a
        // worker started on an idle queue) would scan it whole at every run once it has
        // grown, where each statement here looks rows up by an index (the held set's rebuild
        // looked every ledger entry's message up that way, and stalled the worker).
        let _no_seqscan = SetFor::new(&raw mut pg_sys::enable_seqscan, false);
        // SAFETY: the plan is kept; values and nulls have the plan's argument count. (A
        // statement that returns no rows leaves SPI_tuptable as it was.)
        let status = unsafe {
            pg_sys::SPI_tuptable = std::ptr::null_mut();
            if latest {
                let (now, none) = (pg_sys::GetLatestSnapshot(), std::ptr::null_mut());
                pg_sys::SPI_execute_snapshot(plan, values.as_mut_ptr(), nulls.as_ptr(), now, none, true, false, 0)
            } else {
                pg_sys::SPI_execute_plan(plan, values.as_mut_ptr(), nulls.as_ptr(), false, 0)
            }
        };
        if status < 0 {
            error!("pgqueue: a statement failed: SPI error {status}");
        }
        // SAFETY: set by the execution just done.
        unsafe { Rows { table: pg_sys::SPI_tuptable, n: pg_sys::SPI_processed as usize } }
    }
}

/// A boolean setting of the session (`jit`, `enable_seqscan`) at `value` while it lives,
/// restored when dropped (also when an error unwinds).
struct SetFor(*mut bool, bool);

impl SetFor {
    fn new(setting: *mut bool, value: bool) -> SetFor {
        // SAFETY: `setting` is one of PostgreSQL's boolean settings, this process's own.
        unsafe {
            let was = *setting;
            *setting = value;
            SetFor(setting, was)
        }
    }
}

impl Drop for SetFor {
    fn drop(&mut self) {
        // SAFETY: restores the value read in new.
        unsafe { *self.0 = self.1 };
    }
}

/// What a statement returned; freed when dropped.
pub struct Rows {
    table: *mut pg_sys::SPITupleTable,
    n: usize,
}

impl Rows {
    pub fn len(&self) -> usize {
        if self.table.is_null() { 0 } else { self.n }
    }

    /// Column `col` (from 1) of row `row` (from 0), as it is: pointing into this result.
    pub fn datum(&self, row: usize, col: i32) -> Option<pg_sys::Datum> {
        assert!(row < self.len());
        let mut is_null = false;
        // SAFETY: row is within the table; SPI_getbinval checks the column number.
        let datum = unsafe {
            let tuple = *(*self.table).vals.add(row);
            pg_sys::SPI_getbinval(tuple, (*self.table).tupdesc, col, &mut is_null)
        };
        (!is_null).then_some(datum)
    }

    /// Column `col` of row `row`, as a Rust value (copied out of this result).
    pub fn get<T: FromDatum>(&self, row: usize, col: i32) -> Option<T> {
        // SAFETY: the statements' result types are fixed by their text, and callers ask for
        // the matching Rust type.
        self.datum(row, col).and_then(|d| unsafe { T::from_polymorphic_datum(d, false, pg_sys::InvalidOid) })
    }

    /// Column `col` of row `row` copied into `context`, to outlive this result (a varlena
    /// column, such as jsonb).
    pub fn copy_into(&self, row: usize, col: i32, context: pg_sys::MemoryContext) -> Option<pg_sys::Datum> {
        self.datum(row, col).map(|d| {
            // SAFETY: d is a varlena from this result (possibly a pointer to its TOASTed
            // value, which stays valid: the row still holds it); copied byte for byte.
            unsafe {
                let size = pgrx::varlena::varsize_any(d.cast_mut_ptr());
                let copy = pg_sys::MemoryContextAlloc(context, size);
                std::ptr::copy_nonoverlapping(d.cast_mut_ptr::<u8>(), copy.cast::<u8>(), size);
                pg_sys::Datum::from(copy)
            }
        })
    }
}

impl Drop for Rows {
    fn drop(&mut self) {
        if !self.table.is_null() {
            // SAFETY: the table of the execution that made this value, freed once.
            unsafe { pg_sys::SPI_freetuptable(self.table) };
        }
    }
}
