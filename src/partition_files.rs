//! The end of a prune: the old files of a truncated history partition. PostgreSQL frees them
//! in one go once the pruning transaction commits, and on a file system that discards freed
//! blocks as it goes (ext4 mounted with `discard`, as cloud disks often are) freeing 150 MB
//! at once held every other commit's WAL flush for 10–30 ms (docs/benchmarks/history.md, "A
//! prune that holds up no commit"). So at commit, right before PostgreSQL deletes them, the files are cut
//! down from the end a few megabytes at a time, each step flushed on its own.
//!
//! Only files that this very commit deletes are touched: they are looked up in PostgreSQL's
//! own list of the relation files a commit deletes, so a truncate rolled back (with its
//! savepoint or its transaction) cuts nothing. Files the kernel has not written out yet (a
//! partition written minutes ago) are left to PostgreSQL too: a step's flush would write
//! them first. Each step is an optimisation: a failure is logged and the rest is left to
//! PostgreSQL.

use pgrx::pg_sys;
use pgrx::prelude::*;
use std::cell::RefCell;
use std::ffi::c_void;
use std::fs::{File, OpenOptions};

/// Freed per step: small enough that a step's flush is short (BENCHMARKS.md).
const STEP: u64 = 2 << 20;

/// A relation's main fork: where it is and which storage it is.
struct Files {
    spc: pg_sys::Oid,
    db: pg_sys::Oid,
    number: pg_sys::Oid,
    path: String,
}

thread_local! {
    static NOTED: RefCell<Vec<Files>> = const { RefCell::new(Vec::new()) };
}

/// Registers the callback for this process (whenever the library is loaded).
pub fn init() {
    // SAFETY: a permanent callback; it runs in this process only.
    unsafe { pg_sys::RegisterXactCallback(Some(on_xact), std::ptr::null_mut()) };
}

/// Notes `part`'s current files: if this transaction's commit deletes them (a TRUNCATE
/// replaced them), they are freed in steps first.
#[pg_extern(volatile, parallel_unsafe)]
fn _free_in_steps(part: pg_sys::Oid) {
    let row = Spi::get_three_with_args::<String, pg_sys::Oid, pg_sys::Oid>(
        "SELECT pg_relation_filepath(c.oid), c.relfilenode, c.reltablespace FROM pg_class c WHERE c.oid = $1",
        &[part.into()],
    );
    let Ok((Some(path), Some(number), Some(spc))) = row else {
        return; // no storage of its own (a partitioned table, a view): nothing to free
    };
    // SAFETY: plain reads of this backend's globals.
    let (db, default_spc) = unsafe { (pg_sys::MyDatabaseId, pg_sys::MyDatabaseTableSpace) };
    let spc = if spc == pg_sys::InvalidOid { default_spc } else { spc };
    NOTED.with_borrow_mut(|noted| noted.push(Files { spc, db, number, path }));
}

#[pg_guard]
unsafe extern "C-unwind" fn on_xact(event: pg_sys::XactEvent::Type, _arg: *mut c_void) {
    use pg_sys::XactEvent::*;
    match event {
        XACT_EVENT_COMMIT => {
            for files in NOTED.with_borrow_mut(std::mem::take).iter().filter(|f| deleted_by_this_commit(f)) {
                cut_down(&files.path);
            }
        }
        // A prepared transaction commits later, elsewhere: PostgreSQL frees its files alone.
        XACT_EVENT_ABORT | XACT_EVENT_PREPARE => NOTED.with_borrow_mut(Vec::clear),
        _ => {}
    }
}

/// Whether `files` are among those PostgreSQL deletes as this transaction commits.
fn deleted_by_this_commit(files: &Files) -> bool {
    let mut list = std::ptr::null_mut();
    // SAFETY: called while the transaction commits, before PostgreSQL deletes the files; the
    // list is palloc'd in the current (transaction) context and read only here.
    let n = unsafe { pg_sys::smgrGetPendingDeletes(true, &mut list) };
    if n <= 0 || list.is_null() {
        return false;
    }
    // SAFETY: `list` holds `n` entries.
    let list = unsafe { std::slice::from_raw_parts(list, n as usize) };
    #[cfg(feature = "pg15")]
    let is = |l: &pg_sys::RelFileNode| l.spcNode == files.spc && l.dbNode == files.db && l.relNode == files.number;
    #[cfg(not(feature = "pg15"))]
    let is = |l: &pg_sys::RelFileLocator| l.spcOid == files.spc && l.dbOid == files.db && l.relNumber == files.number;
    list.iter().any(is)
}

/// Shrinks each segment of the fork (`path`, `path.1`, …), the last first, by `STEP` at a
/// time, flushing each step. The files stay, empty: deleting them is PostgreSQL's. Says what
/// it did at DEBUG1.
fn cut_down(path: &str) {
    let segments: Vec<String> = std::iter::once(path.to_string())
        .chain((1..).map(|i| format!("{path}.{i}")))
        .take_while(|p| std::path::Path::new(p).exists())
        .collect();
    let mut steps = 0;
    for segment in segments.iter().rev() {
        match cut(segment, &mut steps) {
            Ok(true) => {}
            Ok(false) => {
                debug1!("pgqueue: {path} left to PostgreSQL: the kernel holds some of it unwritten, or cannot say");
                return;
            }
            Err(e) => {
                debug1!("pgqueue: {path} left to PostgreSQL: {segment}: {e}");
                return;
            }
        }
    }
    debug1!("pgqueue: {path} freed in {steps} steps");
}

/// Cuts `segment` down to nothing, counting the steps; false if the kernel holds some of it
/// unwritten (or cannot say): each step's flush would first write that out, data about to be
/// deleted, so PostgreSQL frees it at once instead.
fn cut(segment: &str, steps: &mut u32) -> std::io::Result<bool> {
    let file = OpenOptions::new().write(true).open(segment)?;
    let mut len = file.metadata()?.len();
    while len > 0 {
        if unwritten(&file) != Some(0) {
            return Ok(false);
        }
        len = len.saturating_sub(STEP);
        file.set_len(len)?;
        file.sync_data()?;
        *steps += 1;
    }
    Ok(true)
}

/// How many of `file`'s pages the kernel holds dirty or under writeback, where it can say
/// (Linux 6.5 and later: `cachestat`, the same call number on these architectures).
#[cfg(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64")))]
fn unwritten(file: &File) -> Option<u64> {
    use std::os::fd::AsRawFd;
    #[repr(C)]
    struct Range {
        off: u64,
        len: u64,
    }
    #[repr(C)]
    #[derive(Default)]
    struct Stat {
        cache: u64,
        dirty: u64,
        writeback: u64,
        evicted: u64,
        recently_evicted: u64,
    }
    const SYS_CACHESTAT: libc::c_long = 451;
    let range = Range { off: 0, len: 0 }; // len 0: to the end of the file
    let mut stat = Stat::default();
    // SAFETY: both structs are laid out as the kernel's and outlive the call.
    let r = unsafe { libc::syscall(SYS_CACHESTAT, file.as_raw_fd(), &range, &mut stat, 0) };
    (r == 0).then_some(stat.dirty + stat.writeback)
}

#[cfg(not(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64"))))]
fn unwritten(_file: &File) -> Option<u64> {
    None
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use super::{STEP, cut, unwritten};
    use std::io::Write;

    /// A file the kernel holds unwritten is left as it is; once written out, it is cut down to
    /// nothing, a step at a time. (Where the kernel cannot say, every file is left.)
    #[pgrx::pg_test]
    fn test_unwritten_files_are_left_and_written_ones_cut_in_steps() {
        // In the data directory (the backend's), on the file system relation files live on.
        let path = format!("pgqueue-cut-test.{}", std::process::id());
        let mut file = std::fs::File::create(&path).unwrap();
        file.write_all(&vec![7u8; 5 << 20]).unwrap();
        let kernel_says = unwritten(&file).is_some();
        let mut steps = 0;
        assert!(!cut(&path, &mut steps).unwrap(), "a file not written out yet is left");
        assert_eq!((steps, file.metadata().unwrap().len()), (0, 5 << 20));
        file.sync_all().unwrap();
        assert_eq!(unwritten(&file), kernel_says.then_some(0));
        assert_eq!(cut(&path, &mut steps).unwrap(), kernel_says);
        if kernel_says {
            assert_eq!((steps, file.metadata().unwrap().len()), ((5_u64 << 20).div_ceil(STEP) as u32, 0));
        }
        std::fs::remove_file(&path).unwrap();
    }
}
