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

/// The lines of `text`'s section under the heading `heading` (written as on the page, `## Next`),
/// up to the next heading of the same or a higher level; prose only.
fn section<'a>(text: &'a str, heading: &str) -> Vec<&'a str> {
    let level = heading.chars().take_while(|c| *c == '#').count();
    let mut lines = prose(text)
        .into_iter()
        .skip_while(|line| line.trim_end() != heading);
    let mut found = Vec::new();
    if lines.next().is_none() {
        return found;
    }
    for line in lines {
        let hashes = line.chars().take_while(|c| *c == '#').count();
        if hashes > 0 && hashes <= level && line[hashes..].starts_with(' ') {
            break;
        }
        found.push(line);
    }
    found
}

/// Whether `text` holds `word` with no letter, digit, `+` or `_` right before or after it (so
/// `unix://` is not found in `redis+unix://`, nor `Redis` in `Redisson`).
fn names(text: &str, word: &str) -> bool {
    let inside = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '+' || c == '_');
    text.match_indices(word).any(|(at, _)| {
        !inside(text[..at].chars().next_back()) && !inside(text[at + word.len()..].chars().next())
    })
}

/// The Markdown list item (a line starting `- ` and its indented continuation lines) among
/// `lines` that links to `target`, joined into one line.
fn list_item(lines: &[&str], target: &str) -> Option<String> {
    let mut items: Vec<String> = Vec::new();
    for line in lines {
        if let Some(item) = line.strip_prefix("- ") {
            items.push(item.to_owned());
        } else if line.starts_with("  ") && !line.trim().is_empty() {
            if let Some(last) = items.last_mut() {
                last.push(' ');
                last.push_str(line.trim());
            }
        }
    }
    items
        .into_iter()
        .find(|item| item.contains(&format!("]({target}")))
}

/// Every scheme of `lock-runtime/src/store/url.rs`'s `SCHEMES` table: the quoted names of each
/// `schemes: &[…]` array, read from the source.
fn url_schemes() -> Vec<String> {
    let source = read(Path::new("lock-runtime/src/store/url.rs"));
    let mut schemes = Vec::new();
    for (at, found) in source.match_indices("schemes: &[") {
        let rest = &source[at + found.len()..];
        let end = rest
            .find(']')
            .unwrap_or_else(|| panic!("url.rs: a `schemes: &[` without `]`"));
        schemes.extend(
            rest[..end]
                .split(',')
                .map(|s| s.trim().trim_matches('"'))
                .filter(|s| !s.is_empty())
                .map(str::to_owned),
        );
    }
    schemes
}

/// lock-runtime's cargo features (the keys of its `[features]` table but `default`), and the
/// ones `default` turns on.
fn cargo_features() -> (Vec<String>, Vec<String>) {
    let manifest = read(Path::new("lock-runtime/Cargo.toml"));
    let mut features = Vec::new();
    let mut defaults = Vec::new();
    let table = manifest
        .lines()
        .skip_while(|line| line.trim() != "[features]")
        .skip(1)
        .take_while(|line| !line.starts_with('['));
    for line in table {
        let line = line.trim();
        if line.starts_with('#') {
            continue;
        }
        let Some((name, value)) = line.split_once('=') else {
            continue;
        };
        let name = name.trim();
        if name == "default" {
            defaults = value
                .trim()
                .trim_start_matches('[')
                .trim_end_matches(']')
                .split(',')
                .map(|f| f.trim().trim_matches('"').to_owned())
                .filter(|f| !f.is_empty())
                .collect();
        } else {
            features.push(name.to_owned());
        }
    }
    (features, defaults)
}

/// The names of examples/Cargo.toml's `[[example]]` targets.
fn example_names() -> Vec<String> {
    let manifest = read(Path::new("examples/Cargo.toml"));
    let mut names = Vec::new();
    let mut in_example = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_example = line == "[[example]]";
        } else if in_example {
            if let Some(name) = line.strip_prefix("name = ") {
                names.push(name.trim_matches('"').to_owned());
            }
        }
    }
    names
}

/// The stores, as the guide names them.
const STORES: [&str; 9] = [
    "Redis",
    "Sentinel",
    "Cluster",
    "RedLock",
    "etcd",
    "ZooKeeper",
    "PostgreSQL",
    "MySQL",
    "memory",
];

/// Every URL scheme `LockClient::connect` takes (each entry of the `schemes: &[…]` arrays of
/// url.rs's `SCHEMES` table) is written `<scheme>://` in the prose of docs/choosing-a-store.md's
/// "Moving between stores", so a store or a spelling added to the table without the page fails
/// here.
#[test]
fn choosing_a_store_names_every_url_scheme() {
    let schemes = url_schemes();
    assert!(
        schemes.len() >= 10 && schemes.iter().any(|s| s == "zk"),
        "url.rs's schemes read as {schemes:?}: is the table still parsed right?"
    );
    let page = section(
        &read(Path::new("docs/choosing-a-store.md")),
        "## Moving between stores",
    )
    .join("\n");
    let missing: Vec<String> = schemes
        .iter()
        .map(|s| format!("{s}://"))
        .filter(|s| !names(&page, s))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/choosing-a-store.md's \"Moving between stores\" does not name these schemes of url.rs: {}",
        missing.join(", ")
    );
}

/// Every cargo feature of lock-runtime that is not on by default is named in backticks in
/// docs/getting-started.md's paragraph on features (the one saying what "the default features
/// give"), and every feature, default or not, has a row of docs/operating.md's "Cargo features"
/// table.
#[test]
fn every_cargo_feature_is_named_where_the_guide_lists_them() {
    let (features, defaults) = cargo_features();
    assert!(
        features.len() >= 10 && !defaults.is_empty(),
        "lock-runtime's features read as {features:?}, default {defaults:?}: is the table still parsed right?"
    );
    let mut missing = Vec::new();

    let start = read(Path::new("docs/getting-started.md"));
    let paragraph = prose(&start)
        .join("\n")
        .split("\n\n")
        .find(|p| p.contains("default features give"))
        .map(str::to_owned)
        .expect("docs/getting-started.md has a paragraph saying what \"the default features give\"");
    for feature in features.iter().filter(|f| !defaults.contains(f)) {
        if !paragraph.contains(&format!("`{feature}`")) {
            missing.push(format!(
                "docs/getting-started.md's features paragraph: `{feature}`"
            ));
        }
    }

    let operating = read(Path::new("docs/operating.md"));
    let table = section(&operating, "## Cargo features");
    for feature in &features {
        let row = format!("| `{feature}` |");
        if !table.iter().any(|line| line.starts_with(&row)) {
            missing.push(format!(
                "docs/operating.md's Cargo features table: no row `{row}`"
            ));
        }
    }
    assert!(missing.is_empty(), "features not named:\n{}", missing.join("\n"));
}

/// Every `[[example]]` of examples/Cargo.toml is named in the `examples/` row of README.md's
/// layout table and of docs/README.md's "Where the code is", and every store's folder or file
/// under lock-runtime/src/store/ (but the seam's own files) in their `lock-runtime/` rows.
#[test]
fn the_layout_tables_name_every_example_and_store() {
    let examples = example_names();
    assert!(
        examples.len() >= 4 && examples.iter().any(|e| e == "payment_dedup"),
        "examples/Cargo.toml's examples read as {examples:?}: is it still parsed right?"
    );
    let store_dir = root().join("lock-runtime/src/store");
    let seam = ["mod.rs", "url.rs", "decode.rs", "announcement.rs"];
    let mut stores: Vec<String> = std::fs::read_dir(&store_dir)
        .unwrap_or_else(|e| panic!("{}: {e}", store_dir.display()))
        .filter_map(Result::ok)
        .map(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            if entry.path().is_dir() {
                format!("{name}/")
            } else {
                name
            }
        })
        .filter(|name| !seam.contains(&name.as_str()))
        .collect();
    stores.sort();

    let mut missing = Vec::new();
    for page in ["README.md", "docs/README.md"] {
        let text = read(Path::new(page));
        let row = |path: &str| {
            prose(&text)
                .into_iter()
                .find(|line| line.starts_with(&format!("| `{path}` |")))
                .map(str::to_owned)
                .unwrap_or_else(|| panic!("{page} has no layout row for `{path}`"))
        };
        let examples_row = row("examples/");
        for example in &examples {
            if !examples_row.contains(&format!("`{example}`")) {
                missing.push(format!("{page}, row `examples/`: `{example}`"));
            }
        }
        let runtime_row = row("lock-runtime/");
        for store in &stores {
            if !names(&runtime_row, &format!("`{store}`")) {
                missing.push(format!("{page}, row `lock-runtime/`: `{store}`"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "not in the layout tables:\n{}",
        missing.join("\n")
    );
}

/// Where the guide points a reader at the stores, it names every one of them: the "Choosing a
/// store" entries of README.md's guide list, of docs/README.md's table and of
/// docs/getting-started.md's "Next", and docs/README.md's "Deployments" entry (every store but
/// memory, which has no deployment).
#[test]
fn the_guide_names_every_store_where_it_lists_them() {
    let readme = read(Path::new("README.md"));
    let guide = read(Path::new("docs/README.md"));
    let start = read(Path::new("docs/getting-started.md"));
    let row = |target: &str| {
        prose(&guide)
            .into_iter()
            .find(|line| line.starts_with('|') && line.contains(&format!("]({target})")))
            .map(str::to_owned)
            .unwrap_or_else(|| panic!("docs/README.md has no row linking {target}"))
    };
    let places = [
        (
            "README.md, The guide: Choosing a store",
            list_item(&section(&readme, "## The guide"), "docs/choosing-a-store.md")
                .expect("README.md's guide list links docs/choosing-a-store.md"),
            &STORES[..],
        ),
        (
            "docs/getting-started.md, Next: Choosing a store",
            list_item(&section(&start, "## Next"), "choosing-a-store.md")
                .expect("docs/getting-started.md's Next links choosing-a-store.md"),
            &STORES[..],
        ),
        (
            "docs/README.md, Choosing a store",
            row("choosing-a-store.md"),
            &STORES[..],
        ),
        (
            "docs/README.md, Deployments",
            row("deployments.md"),
            &STORES[..STORES.len() - 1],
        ),
    ];
    let mut missing = Vec::new();
    for (place, text, stores) in places {
        let absent: Vec<&str> = stores.iter().copied().filter(|s| !names(&text, s)).collect();
        if !absent.is_empty() {
            missing.push(format!("{place}: {}", absent.join(", ")));
        }
    }
    assert!(missing.is_empty(), "stores not named:\n{}", missing.join("\n"));
}

/// Getting started's `src/main.rs` installs a tracing subscriber before anything else, and its
/// Cargo.toml brings the crate: the warnings the guide promises (a lock lost with `on_lost =
/// "continue"`, a ZooKeeper fenced release without WRITE, etcd's version check) reach the log of
/// an app built from the page.
#[test]
fn getting_started_installs_a_tracing_subscriber() {
    let page = read(Path::new("docs/getting-started.md"));
    let main = page
        .split("async fn main() -> Result<(), Box<dyn std::error::Error>> {")
        .nth(1)
        .unwrap_or_else(|| panic!("getting-started has no main of the handler"));
    let first = main
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or_default();
    assert!(
        first.starts_with("tracing_subscriber::fmt::init();"),
        "main's first line: {first}"
    );
    assert!(
        page.contains("\ntracing-subscriber = \"0.3\"\n"),
        "the page's Cargo.toml lacks tracing-subscriber"
    );
}
