//! docs/spec-coverage.md maps every MUST/SHOULD of [MS-SMBD] section 3 and
//! [MS-SQOS] section 3 to the tests that pin it. This test keeps that table
//! honest: every test it names must exist as a `fn` somewhere in the
//! workspace, and every row must name a test or say why none can exist.

use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("protocol/ has a parent")
        .to_path_buf()
}

fn collect_rs(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        let p = e.path();
        let name = e.file_name();
        let name = name.to_string_lossy();
        if p.is_dir() {
            if name == "target" || name.starts_with('.') {
                continue;
            }
            collect_rs(&p, out);
        } else if name.ends_with(".rs") {
            out.push(p);
        }
    }
}

fn defined_fns() -> HashSet<String> {
    let mut files = Vec::new();
    collect_rs(&workspace_root(), &mut files);
    let mut fns = HashSet::new();
    for f in files {
        let Ok(text) = fs::read_to_string(&f) else {
            continue;
        };
        for (i, _) in text.match_indices("fn ") {
            // Must be at a word boundary.
            if i > 0 {
                let prev = text.as_bytes()[i - 1];
                if prev.is_ascii_alphanumeric() || prev == b'_' {
                    continue;
                }
            }
            let name: String = text[i + 3..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                fns.insert(name);
            }
        }
    }
    fns
}

struct Row {
    line: usize,
    section: String,
    tests: Vec<String>,
    none_reason: bool,
}

fn rows_of(table_heading: &str, doc: &str) -> Vec<Row> {
    let mut rows = Vec::new();
    let mut inside = false;
    for (n, line) in doc.lines().enumerate() {
        if line.starts_with("## ") {
            inside = line.trim() == table_heading;
            continue;
        }
        if !inside || !line.trim_start().starts_with('|') {
            continue;
        }
        let cells: Vec<&str> = line
            .trim()
            .trim_matches('|')
            .split('|')
            .map(str::trim)
            .collect();
        if cells.len() < 4 || cells[0] == "Section" || cells[0].starts_with("---") {
            continue;
        }
        let test_cell = cells[cells.len() - 1];
        let tests: Vec<String> = test_cell
            .split('`')
            .enumerate()
            .filter(|(i, _)| i % 2 == 1)
            .map(|(_, s)| s.trim().trim_end_matches("()").to_string())
            .collect();
        rows.push(Row {
            line: n + 1,
            section: cells[0].to_string(),
            tests,
            none_reason: test_cell.starts_with("none:"),
        });
    }
    rows
}

fn check(table_heading: &str, min_rows: usize) {
    let doc = fs::read_to_string(workspace_root().join("docs/spec-coverage.md"))
        .expect("docs/spec-coverage.md exists");
    let rows = rows_of(table_heading, &doc);
    assert!(
        rows.len() >= min_rows,
        "{table_heading}: only {} rows; every MUST/SHOULD of the section needs one",
        rows.len()
    );
    let fns = defined_fns();
    let mut problems = Vec::new();
    for r in &rows {
        if r.tests.is_empty() && !r.none_reason {
            problems.push(format!(
                "line {} ({}): names no test and gives no `none:` reason",
                r.line, r.section
            ));
        }
        for t in &r.tests {
            let last = t.rsplit("::").next().unwrap_or(t);
            if !fns.contains(last) {
                problems.push(format!(
                    "line {} ({}): test `{}` does not exist",
                    r.line, r.section, t
                ));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "docs/spec-coverage.md is out of date:\n{}",
        problems.join("\n")
    );
}

#[test]
fn every_smbd_rule_names_an_existing_test() {
    check("## [MS-SMBD] section 3", 40);
}

#[test]
fn every_sqos_rule_names_an_existing_test() {
    check("## [MS-SQOS] section 3", 20);
}

#[test]
fn checker_detects_a_missing_test_name() {
    let doc = "## T\n| Section | Kind | Rule | Test |\n|---|---|---|---|\n| 1 | MUST | r | `no_such_test_fn_xyzzy` |\n| 2 | MUST | r | none: provider |\n";
    let rows = rows_of("## T", doc);
    assert_eq!(rows.len(), 2);
    assert!(!defined_fns().contains("no_such_test_fn_xyzzy"));
    assert!(rows[1].none_reason && rows[1].tests.is_empty());
}
