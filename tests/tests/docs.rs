//! The documentation holds together: every relative link of README.md, BENCHMARKS.md and the
//! guide in docs/ reaches a file that exists (and, with `#anchor`, a heading there), and every Rust
//! code block is one that the doc tests compile (`tests/src/lib.rs` includes each page; a block
//! marked `ignore` would escape them). README stays the front door: under 300 lines.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| panic!("the kit is not in a workspace"))
}

/// README.md, BENCHMARKS.md and every page of docs/, relative to the workspace root.
fn pages() -> Vec<PathBuf> {
    let mut pages = vec![PathBuf::from("README.md"), PathBuf::from("BENCHMARKS.md")];
    let docs = std::fs::read_dir(root().join("docs")).unwrap_or_else(|e| panic!("docs/: {e}"));
    let mut guide: Vec<PathBuf> = docs
        .filter_map(Result::ok)
        .map(|entry| PathBuf::from("docs").join(entry.file_name()))
        .filter(|path| path.extension().is_some_and(|e| e == "md"))
        .collect();
    guide.sort();
    pages.extend(guide);
    pages
}

fn read(page: &Path) -> String {
    std::fs::read_to_string(root().join(page)).unwrap_or_else(|e| panic!("{}: {e}", page.display()))
}

/// The page's lines outside fenced code blocks.
fn prose(text: &str) -> Vec<&str> {
    let mut inside = false;
    text.lines()
        .filter(|line| {
            if line.trim_start().starts_with("```") {
                inside = !inside;
                return false;
            }
            !inside
        })
        .collect()
}

/// GitHub's anchors for the page's headings: lowercased, punctuation dropped, spaces to
/// hyphens, a repeated one numbered.
fn anchors(text: &str) -> HashSet<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut anchors = HashSet::new();
    for line in prose(text) {
        let Some(heading) = line.strip_prefix('#').map(|h| h.trim_start_matches('#')) else {
            continue;
        };
        let slug: String = heading
            .trim()
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let n = seen.entry(slug.clone()).or_insert(0);
        anchors.insert(if *n == 0 {
            slug.clone()
        } else {
            format!("{slug}-{n}")
        });
        *n += 1;
    }
    anchors
}

/// The targets of the page's Markdown links `[text](target)`.
fn links(text: &str) -> Vec<String> {
    let mut links = Vec::new();
    for line in prose(text) {
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            match after.find(')') {
                Some(end) => {
                    links.push(after[..end].to_owned());
                    rest = &after[end..];
                }
                None => break,
            }
        }
    }
    links
}

#[test]
fn every_relative_link_reaches_a_file_and_a_heading() {
    let mut broken = Vec::new();
    for page in pages() {
        let text = read(&page);
        for link in links(&text) {
            if link.starts_with("http://") || link.starts_with("https://") || link.starts_with("mailto:") {
                continue;
            }
            let (file, anchor) = match link.split_once('#') {
                Some((file, anchor)) => (file, Some(anchor)),
                None => (link.as_str(), None),
            };
            let target = if file.is_empty() {
                page.clone()
            } else {
                page.parent().unwrap_or(Path::new("")).join(file)
            };
            let path = root().join(&target);
            if !path.exists() {
                broken.push(format!("{}: {link} (no {})", page.display(), target.display()));
                continue;
            }
            if let Some(anchor) = anchor {
                if !anchors(&read(&target)).contains(anchor) {
                    broken.push(format!(
                        "{}: {link} (no heading #{anchor} in {})",
                        page.display(),
                        target.display()
                    ));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn every_rust_block_is_compiled_by_the_doc_tests() {
    let lib =
        std::fs::read_to_string(root().join("tests/src/lib.rs")).unwrap_or_else(|e| panic!("lib.rs: {e}"));
    let mut escaped = Vec::new();
    for page in pages() {
        let text = read(&page);
        let has_rust = text.lines().any(|l| l.trim_start().starts_with("```rust"));
        let included = lib.contains(&format!("include_str!(\"../../{}\")", page.display()));
        if has_rust && !included {
            escaped.push(format!(
                "{}: has Rust blocks but tests/src/lib.rs does not include it",
                page.display()
            ));
        }
        for (n, line) in text.lines().enumerate() {
            let fence = line.trim_start();
            if fence.starts_with("```rust") && fence.contains("ignore") {
                escaped.push(format!(
                    "{}:{}: `{fence}` is never compiled",
                    page.display(),
                    n + 1
                ));
            }
        }
    }
    assert!(escaped.is_empty(), "{}", escaped.join("\n"));
}

#[test]
fn the_readme_is_a_front_door() {
    let lines = read(Path::new("README.md")).lines().count();
    assert!(lines < 300, "README.md has {lines} lines: depth goes to docs/");
}

/// CI runs README's test command as written: the command on README's "the tests" line is the last
/// line of `.ci/run`, and the getting-started check that CI runs before it exists.
#[test]
fn ci_runs_the_readme_test_command() {
    let readme = read(Path::new("README.md"));
    let command = readme
        .lines()
        .find(|line| line.contains("# the tests"))
        .and_then(|line| line.split('#').next())
        .map(str::trim)
        .expect("README.md has a line `<command>   # the tests: …`");
    let ci = read(Path::new(".ci/run"));
    let last = ci
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('#'));
    assert_eq!(last, Some(command), ".ci/run must end with README's test command");
    for script in [command, "scripts/check-getting-started"] {
        assert!(ci.contains(script), ".ci/run does not run {script}");
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(script);
        assert!(path.is_file(), "{script} is not a file of the checkout");
    }
}

/// Every test the promises ledger names (`path/to/file.rs::name`, `…::module::name`,
/// `…::prefix_*`) is a fn in that file: a test renamed or removed leaves its promise without a
/// backing, and this says which.
#[test]
fn every_test_the_promises_name_exists() {
    let ledger = read(Path::new("docs/promises.md"));
    let mut checked = 0;
    let mut missing = Vec::new();
    for quoted in ledger.split('`').skip(1).step_by(2) {
        let Some((file, path)) = quoted.split_once(".rs::") else {
            continue;
        };
        if !["tests/", "lock-runtime/", "lock-macros/", "examples/"]
            .iter()
            .any(|root| file.starts_with(root))
        {
            continue; // a short form (`attribute_forms.rs::…`) next to a full one
        }
        // `module::name` (a test module, or one the kit's macros generate per deployment): the
        // fn is the last segment; `prefix_*` stands for every fn that starts so.
        let path: String = path
            .chars()
            .take_while(|c| c.is_alphanumeric() || matches!(c, '_' | ':' | '*'))
            .collect();
        let last = path.rsplit("::").next().unwrap_or_default();
        if last.is_empty() {
            continue; // a whole module (`…::etcd::`), generated per deployment by the kit
        }
        let (name, prefix) = match last.strip_suffix('*') {
            Some(name) => (name, true),
            None => (last, false),
        };
        let file = format!("{file}.rs");
        let Ok(source) = std::fs::read_to_string(root().join(&file)) else {
            missing.push(format!("{file} (no such file)"));
            continue;
        };
        let whole = |rest: &str| !rest.starts_with(|c: char| c.is_alphanumeric() || c == '_');
        let defined = source
            .match_indices(&format!("fn {name}"))
            .any(|(at, found)| prefix || whole(&source[at + found.len()..]));
        if !defined {
            missing.push(format!("{file}::{path}"));
        }
        checked += 1;
    }
    assert!(
        checked > 100,
        "the ledger names {checked} tests: is it still parsed right?"
    );
    assert!(
        missing.is_empty(),
        "named in docs/promises.md, not found:\n{}",
        missing.join("\n")
    );
}
