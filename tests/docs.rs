//! Docs are tests: every ```sql block of README.md and of the pages in docs/ runs against the
//! test server, and where a page shows what a statement returns or which error it raises, the
//! result is compared with it.
//!
//! The convention (docs/development.md, "Docs are tests"):
//! - each page runs in a database of its own, its blocks in order, each statement on its own
//!   in autocommit (so `BEGIN; … COMMIT;` works); the extension is created first unless the
//!   page creates it;
//! - a statement ends with a line ending in `;` (a trailing `-- comment` after it is allowed);
//! - `--  value` lines right after a statement are the rows it returns, one line a row: the
//!   first column, or every column joined by ` | ` when the line has one; text after two more
//!   spaces is a comment;
//! - `--  ERROR 22023` after a statement: it fails with that SQLSTATE;
//! - a block fenced as ```sql norun is not run (it needs another server, or psql).

mod common;

use postgres::SimpleQueryMessage;
use std::path::{Path, PathBuf};

#[derive(Debug, PartialEq)]
enum Expect {
    /// Runs without error; what it returns is not shown.
    Success,
    Rows(Vec<String>),
    Error(String),
}

#[derive(Debug)]
struct Statement {
    sql: String,
    /// Where it starts (file line, 1-based).
    line: usize,
    expect: Expect,
}

#[derive(Debug, Default)]
struct Page {
    statements: Vec<Statement>,
    blocks: usize,
    not_run: usize,
}

/// Whether `line` completes a statement: it ends with `;`, or with `;` and a `--` comment.
fn ends_statement(line: &str) -> bool {
    let t = line.trim();
    if t.starts_with("--") {
        return false;
    }
    t.ends_with(';') || t.rfind(';').is_some_and(|i| t[i + 1..].trim_start().starts_with("--"))
}

/// The statements of a Markdown page's ```sql blocks, or what is wrong with the page.
fn parse(text: &str) -> Result<Page, String> {
    let mut page = Page::default();
    let mut lines = text.lines().enumerate();
    while let Some((_, line)) = lines.next() {
        let Some(info) = line.trim_start().strip_prefix("```") else { continue };
        let info: Vec<&str> = info.split_whitespace().collect();
        let runs = info.first() == Some(&"sql") && !info.contains(&"norun");
        if info.first() == Some(&"sql") {
            page.blocks += 1;
            page.not_run += usize::from(!runs);
        }
        let mut statement = String::new();
        let mut start = 0;
        for (n, line) in lines.by_ref() {
            if line.trim_start().starts_with("```") {
                break;
            }
            if !runs {
                continue;
            }
            if let Some(shown) = line.trim_start().strip_prefix("--  ") {
                let shown = shown.split("  ").next().unwrap_or("").trim().to_string();
                if !statement.trim().is_empty() {
                    return Err(format!("line {}: a result line inside a statement", n + 1));
                }
                let Some(last) = page.statements.last_mut() else {
                    return Err(format!("line {}: a result line before any statement", n + 1));
                };
                match (&mut last.expect, shown.strip_prefix("ERROR ")) {
                    (Expect::Success, Some(code)) => last.expect = Expect::Error(code.trim().to_string()),
                    (Expect::Success, None) => last.expect = Expect::Rows(vec![shown]),
                    (Expect::Rows(rows), None) => rows.push(shown),
                    _ => return Err(format!("line {}: rows and an error for one statement", n + 1)),
                }
                continue;
            }
            if statement.trim().is_empty() {
                start = n + 1;
            }
            statement.push_str(line);
            statement.push('\n');
            if ends_statement(line) {
                page.statements.push(Statement {
                    sql: std::mem::take(&mut statement),
                    line: start,
                    expect: Expect::Success,
                });
            }
        }
        let rest: String = statement.lines().filter(|l| !l.trim().is_empty() && !l.trim().starts_with("--")).collect();
        if !rest.is_empty() {
            return Err(format!("line {start}: a statement without its ';': {statement}"));
        }
    }
    Ok(page)
}

/// A row as the docs show it: the first column, or all of them joined by ` | `.
fn shown(row: &postgres::SimpleQueryRow, all: bool) -> String {
    let value = |i: usize| row.get(i).unwrap_or("NULL").to_string();
    if all { (0..row.len()).map(value).collect::<Vec<_>>().join(" | ") } else { value(0) }
}

/// Runs a page's statements in a new database; what differs from the page.
fn run(name: &str, page: &Page) -> Vec<String> {
    let db = common::unique_queue("docs");
    let mut admin = common::connect();
    admin.batch_execute(&format!("CREATE DATABASE {db}")).unwrap();
    let mut c = common::connect_to(&db);
    let creates = page.statements.iter().any(|s| s.sql.to_lowercase().contains("create extension pgqueue"));
    if !creates {
        c.batch_execute("CREATE EXTENSION pgqueue").unwrap();
    }
    let mut wrong = vec![];
    for s in &page.statements {
        let at = format!("{name}:{}", s.line);
        match (c.simple_query(&s.sql), &s.expect) {
            (Ok(_), Expect::Success) => {}
            (Ok(messages), Expect::Rows(expected)) => {
                let all = expected.iter().any(|e| e.contains(" | "));
                let got: Vec<String> = messages
                    .iter()
                    .filter_map(|m| match m {
                        SimpleQueryMessage::Row(r) => Some(shown(r, all)),
                        _ => None,
                    })
                    .collect();
                if &got != expected {
                    wrong.push(format!("{at}: {}  the page shows {expected:?}\n  it returns    {got:?}", s.sql));
                }
            }
            (Ok(_), Expect::Error(code)) => {
                wrong.push(format!("{at}: {}  the page shows ERROR {code}; it succeeds", s.sql))
            }
            (Err(e), Expect::Error(code)) if e.code().map(|c| c.code()) == Some(code.as_str()) => {}
            (Err(e), _) => {
                let code = e.code().map_or("-", |c| c.code());
                wrong.push(format!(
                    "{at}: {}  fails: {code} {}",
                    s.sql,
                    e.as_db_error().map_or(e.to_string(), |d| match d.detail() {
                        Some(detail) => format!("{} ({detail})", d.message()),
                        None => d.message().into(),
                    })
                ));
            }
        }
    }
    drop(c);
    admin.batch_execute(&format!("DROP DATABASE {db} WITH (FORCE)")).unwrap();
    wrong
}

/// README.md and every page under docs/ (the benchmark history included).
fn pages() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut out = vec![root.join("README.md")];
    walk(&root.join("docs"), &mut out);
    out.sort();
    out
}

#[test]
fn every_sql_example_of_the_docs_runs_and_gives_what_the_page_shows() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let (mut statements, mut shown, mut blocks, mut not_run, mut wrong) = (0, 0, 0, 0, vec![]);
    let mut with_examples = vec![];
    for path in pages() {
        let name = path.strip_prefix(root).unwrap().display().to_string();
        let page = parse(&std::fs::read_to_string(&path).unwrap()).unwrap_or_else(|e| panic!("{name}: {e}"));
        if page.statements.is_empty() {
            continue;
        }
        with_examples.push(name.clone());
        statements += page.statements.len();
        shown += page.statements.iter().filter(|s| s.expect != Expect::Success).count();
        (blocks, not_run) = (blocks + page.blocks, not_run + page.not_run);
        wrong.extend(run(&name, &page));
    }
    eprintln!(
        "{} pages with examples, {blocks} sql blocks ({not_run} not run), {statements} statements run, \
         {shown} with the result or error the page shows: {with_examples:?}",
        with_examples.len()
    );
    assert!(with_examples.contains(&"README.md".to_string()), "the README's quick tour runs");
    assert!(wrong.is_empty(), "{} examples differ from their page:\n{}", wrong.len(), wrong.join("\n"));
}

/// The check fails on a broken example: a wrong result, a function that does not exist, an
/// error that is not raised, a wrong SQLSTATE; and a page it cannot read is refused.
#[test]
fn a_broken_example_fails_the_check() {
    let page = parse(
        "Text.\n\n```sql\nSELECT pgqueue.pgq_create_queue('jobs');\nSELECT 1 + 1;\n--  3\n\
         SELECT pgqueue.pgq_no_such_function();\n```\n\n```sql norun\nSELECT broken(;\n```\n\n\
         ```sql\nSELECT pgqueue.pgq_send('jobs', '{}') IS NOT NULL;  -- a comment\n--  ERROR 22023\n\
         SELECT pgqueue.pgq_send('nope', '{}');\n--  ERROR 22023\nSELECT 1 AS a, 'x' AS b;\n--  1 | x\n```\n",
    )
    .unwrap();
    assert_eq!((page.blocks, page.not_run, page.statements.len()), (3, 1, 6));
    let wrong = run("broken.md", &page);
    assert_eq!(wrong.len(), 4, "{wrong:#?}");
    for (found, says) in wrong.iter().zip(["the page shows [\"3\"]", "fails: 42883", "it succeeds", "fails: 42704"]) {
        assert!(found.contains(says), "{found} should say {says}");
    }
    assert!(parse("```sql\nSELECT 1\n```\n").unwrap_err().contains("without its ';'"));
    assert!(parse("```sql\n--  1\n```\n").unwrap_err().contains("before any statement"));
}
