//! The runtime's layout, checked: the client above the store seam speaks no Redis (no redis-rs
//! path, no pinned connection, no script), `lockctl` is a command line over the library (no
//! store crate, no file of the library included by path), and no two runtime modules import
//! each other, however far round (the graph of `use` paths between the files of
//! `lock-runtime/src` has no cycle); also that the guide for a new store lists the store folders
//! as they are, and that the macro's compile-time limits are the runtime's.
//!
//! ```text
//! cargo test -p lock-tests --test layout
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// `lock-runtime/src`.
fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../lock-runtime/src")
}

/// Every `.rs` file under `dir`, by its path relative to `src`.
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.unwrap_or_else(|e| panic!("{e}")).path();
            if path.is_dir() {
                todo.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

fn relative(path: &Path) -> String {
    path.strip_prefix(src())
        .unwrap_or(path)
        .to_string_lossy()
        .into_owned()
}

/// The code of a file without its comments (line comments, doc comments and block comments),
/// string literals kept.
fn code(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    let (mut in_string, mut block) = (false, 0usize);
    while let Some(c) = chars.next() {
        if block > 0 {
            if c == '*' && chars.peek() == Some(&'/') {
                chars.next();
                block -= 1;
            } else if c == '/' && chars.peek() == Some(&'*') {
                chars.next();
                block += 1;
            } else if c == '\n' {
                out.push('\n');
            }
            continue;
        }
        if in_string {
            out.push(c);
            if c == '\\' {
                if let Some(next) = chars.next() {
                    out.push(next);
                }
            } else if c == '"' {
                in_string = false;
            }
            continue;
        }
        match c {
            '"' => {
                in_string = true;
                out.push(c);
            }
            '/' if chars.peek() == Some(&'/') => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            '/' if chars.peek() == Some(&'*') => {
                chars.next();
                block = 1;
            }
            _ => out.push(c),
        }
    }
    out
}

/// Whether `line` uses the `redis` crate (`redis::…` not preceded by `::` or a word character:
/// the store's own module, `store::redis::…`, is not the crate), a pinned connection or a script.
fn speaks_redis(line: &str) -> bool {
    let bytes = line.as_bytes();
    let crate_path = line.match_indices("redis::").any(|(at, _)| {
        let before = &bytes[..at];
        !(before.ends_with(b"::")
            || before
                .last()
                .is_some_and(|b| b.is_ascii_alphanumeric() || *b == b'_'))
    });
    crate_path || has_word(line, "Pinned") || line.contains("scripts::")
}

fn has_word(line: &str, word: &str) -> bool {
    line.match_indices(word).any(|(at, _)| {
        let before = line[..at].chars().next_back();
        let after = line[at + word.len()..].chars().next();
        !before.is_some_and(|c| c.is_alphanumeric() || c == '_')
            && !after.is_some_and(|c| c.is_alphanumeric() || c == '_')
    })
}

#[test]
fn the_client_above_the_seam_speaks_no_redis() {
    let mut found = Vec::new();
    for file in files(&src()) {
        let name = relative(&file);
        if name.starts_with("store/redis/") || name == "store/redlock.rs" {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{name}: {e}"));
        for (n, line) in code(&text).lines().enumerate() {
            if speaks_redis(line) {
                found.push(format!("{name}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "Redis outside store/redis/ and store/redlock.rs:\n{}",
        found.join("\n")
    );
}

/// The crates the stores speak through, as the runtime declares them: each store's cargo
/// feature as the URL table names it (`store/url.rs`), and the optional dependencies that
/// feature turns on (`lock-runtime/Cargo.toml`), as Rust paths name them. A store added to the
/// table is checked without a change here.
fn store_crates() -> Vec<String> {
    let read =
        |path: PathBuf| std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let table = read(src().join("store/url.rs"));
    let features: Vec<&str> = table
        .lines()
        .filter_map(|line| line.trim().strip_prefix("feature: Some((\""))
        .filter_map(|rest| rest.split('"').next())
        .collect();
    let manifest = read(src().join("../Cargo.toml"));
    let mut crates = BTreeSet::new();
    for line in manifest.lines() {
        let Some((feature, turns_on)) = line.split_once(" = [") else {
            continue;
        };
        if !features.contains(&feature.trim()) {
            continue;
        }
        for dependency in turns_on.split('"').filter_map(|item| item.strip_prefix("dep:")) {
            crates.insert(dependency.replace('-', "_"));
        }
    }
    crates.into_iter().collect()
}

#[test]
fn the_store_crates_are_read_from_the_url_table_and_the_manifest() {
    let crates = store_crates();
    for expected in ["redis", "sqlx", "etcd_client", "zookeeper_client"] {
        assert!(
            crates.iter().any(|c| c == expected),
            "{expected} not among {crates:?}"
        );
    }
}

#[test]
fn lockctl_is_a_command_line_over_the_library() {
    let store_crates = store_crates();
    let mut found = Vec::new();
    for file in files(&src().join("bin/lockctl")) {
        let name = relative(&file);
        let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{name}: {e}"));
        for (n, line) in code(&text).lines().enumerate() {
            let store_crate = store_crates
                .iter()
                .any(|c| line.contains(&format!("{c}::")) || line.contains(&format!("use {c}")));
            if store_crate || line.contains("#[path") {
                found.push(format!("{name}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "lockctl reaches past the library:\n{}",
        found.join("\n")
    );
}

/// The module path of a file (`store/redis/mod.rs` → `["store", "redis"]`).
fn module_of(name: &str) -> Vec<String> {
    let trimmed = name.trim_end_matches(".rs");
    let mut parts: Vec<String> = trimmed.split('/').map(str::to_owned).collect();
    if parts.last().is_some_and(|p| p == "mod" || p == "lib") {
        parts.pop();
    }
    parts
}

/// Every path in `code` that starts at `crate::`, `super::` or `self::`, as written (up to the
/// first character that cannot be in a path), with `use` groups (`a::{b, c::d}`) spread out.
fn paths(code: &str) -> Vec<String> {
    let mut found = Vec::new();
    let bytes: Vec<char> = code.chars().collect();
    let mut i = 0;
    while i < bytes.len() {
        let rest: String = bytes[i..bytes.len().min(i + 8)].iter().collect();
        let starts = ["crate::", "super::", "self::"]
            .iter()
            .any(|s| rest.starts_with(s));
        let boundary =
            i == 0 || !(bytes[i - 1].is_alphanumeric() || bytes[i - 1] == '_' || bytes[i - 1] == ':');
        if !(starts && boundary) {
            i += 1;
            continue;
        }
        let mut end = i;
        let mut depth = 0usize;
        while end < bytes.len() {
            let c = bytes[end];
            if c == '{' {
                depth += 1;
            } else if c == '}' {
                if depth == 0 {
                    break;
                }
                depth -= 1;
            } else if depth == 0 && !(c.is_alphanumeric() || c == '_' || c == ':') {
                break;
            }
            end += 1;
        }
        let text: String = bytes[i..end].iter().collect();
        found.extend(spread(&text));
        i = end.max(i + 1);
    }
    found
}

/// `a::{b, c::{d, e}}` as `a::b`, `a::c::d`, `a::c::e`.
fn spread(path: &str) -> Vec<String> {
    let Some(open) = path.find('{') else {
        return vec![path.trim().to_owned()];
    };
    let head = &path[..open];
    let inner = path[open + 1..].trim_end_matches('}');
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts
        .into_iter()
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .flat_map(|p| spread(&format!("{head}{p}")))
        .collect()
}

#[test]
fn no_two_runtime_modules_import_each_other() {
    let sources: Vec<(String, String)> = files(&src())
        .into_iter()
        .filter(|f| !relative(f).starts_with("bin/"))
        .map(|f| {
            let text = std::fs::read_to_string(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            // A file's unit tests (an inline module at its end, whose `super` is the file) are
            // not what the runtime imports.
            let text = match text.find("#[cfg(test)]\nmod tests") {
                Some(at) => &text[..at],
                None => &text,
            };
            (relative(&f), code(text))
        })
        .collect();
    let modules: BTreeMap<Vec<String>, String> = sources
        .iter()
        .map(|(name, _)| (module_of(name), name.clone()))
        .collect();
    // What the crate root re-exports (`pub use store::X` etc.): `crate::Name` means the file
    // that defines it, not the facade.
    let lib = &sources
        .iter()
        .find(|(name, _)| name == "lib.rs")
        .unwrap_or_else(|| panic!("no lib.rs"))
        .1;
    let mut reexports: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in lib.lines().filter(|l| l.trim_start().starts_with("pub use ")) {
        let path = line.trim().trim_start_matches("pub use ").trim_end_matches(';');
        for full in spread(path) {
            let segments: Vec<String> = full.split("::").map(|s| s.trim().to_owned()).collect();
            if let Some(last) = segments.last() {
                let last = last.split(" as ").last().unwrap_or(last).trim().to_owned();
                reexports.insert(last, segments);
            }
        }
    }
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (name, code) in &sources {
        let here = module_of(name);
        for path in paths(code) {
            let mut segments: Vec<String> = Vec::new();
            let mut parts = path.split("::").map(str::trim).peekable();
            match parts.next() {
                Some("crate") => {
                    let first = parts.peek().map(|s| s.to_string()).unwrap_or_default();
                    if let Some(target) = reexports.get(&first) {
                        parts.next();
                        segments.extend(target.iter().cloned());
                    }
                }
                Some("super") => {
                    // The parent module (of `mod.rs`, its folder's parent).
                    segments = here.clone();
                    segments.pop();
                    while parts.peek() == Some(&"super") {
                        parts.next();
                        segments.pop();
                    }
                }
                Some("self") => segments = here.clone(),
                _ => continue,
            }
            segments.extend(parts.map(str::to_owned));
            // The longest prefix that is a module file.
            let target = (0..=segments.len())
                .rev()
                .find_map(|n| modules.get(&segments[..n]))
                .cloned();
            if let Some(target) = target.filter(|t| t != name && t != "lib.rs") {
                edges.entry(name.clone()).or_default().insert(target);
            }
        }
    }
    // Any cycle, found by depth-first search.
    let mut state: BTreeMap<&str, u8> = BTreeMap::new();
    let mut stack: Vec<&str> = Vec::new();
    fn visit<'a>(
        node: &'a str,
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<&'a str, u8>,
        stack: &mut Vec<&'a str>,
    ) -> Option<Vec<String>> {
        state.insert(node, 1);
        stack.push(node);
        for next in edges.get(node).into_iter().flatten() {
            match state.get(next.as_str()) {
                Some(1) => {
                    let at = stack.iter().position(|n| *n == next).unwrap_or(0);
                    let mut cycle: Vec<String> = stack[at..].iter().map(|s| s.to_string()).collect();
                    cycle.push(next.clone());
                    return Some(cycle);
                }
                Some(_) => {}
                None => {
                    if let Some(cycle) = visit(next, edges, state, stack) {
                        return Some(cycle);
                    }
                }
            }
        }
        stack.pop();
        state.insert(node, 2);
        None
    }
    for node in edges.keys() {
        if state.contains_key(node.as_str()) {
            continue;
        }
        if let Some(cycle) = visit(node, &edges, &mut state, &mut stack) {
            panic!("runtime modules import each other: {}", cycle.join(" -> "));
        }
    }
    assert!(edges.len() > 20, "the import graph was not read: {edges:?}");
}

/// The files a row of `docs/writing-a-store.md`'s layout table names: its backticked words
/// that look like a file (`names.rs`, `schema.sql`) or a folder (`scripts/`).
fn named_files(row: &str) -> BTreeSet<String> {
    row.split('`')
        .skip(1)
        .step_by(2)
        .filter(|word| {
            let plain = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_lowercase() || c == '_');
            match word.strip_suffix('/') {
                Some(folder) => plain(folder),
                None => [".rs", ".sql"]
                    .iter()
                    .any(|ext| word.strip_suffix(ext).is_some_and(plain)),
            }
        })
        .map(str::to_owned)
        .collect()
}

/// What `dir` holds, each by its name (a folder's with a `/` after it) and path.
fn entries(dir: &Path) -> Vec<(String, PathBuf)> {
    let read = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    read.map(|entry| {
        let path = entry.unwrap_or_else(|e| panic!("{e}")).path();
        let name = path
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        (if path.is_dir() { format!("{name}/") } else { name }, path)
    })
    .collect()
}

#[test]
fn the_guide_for_a_new_store_lists_the_store_folders_as_they_are() {
    let guide = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/writing-a-store.md");
    let guide = std::fs::read_to_string(&guide).unwrap_or_else(|e| panic!("{}: {e}", guide.display()));
    // `| `store/…` | … |`: the path, and the rest of the row.
    let rows: BTreeMap<String, String> = guide
        .lines()
        .filter_map(|line| line.strip_prefix("| `store/"))
        .filter_map(|rest| rest.split_once('`'))
        .map(|(path, rest)| (path.to_owned(), rest.to_owned()))
        .collect();
    let store = src().join("store");
    let mut listed = BTreeSet::new();
    for (key, path) in entries(&store) {
        let row = rows
            .get(&key)
            .unwrap_or_else(|| panic!("docs/writing-a-store.md's layout has no row for store/{key}"));
        if path.is_dir() {
            let there: BTreeSet<String> = entries(&path).into_iter().map(|(name, _)| name).collect();
            assert_eq!(
                named_files(row),
                there,
                "docs/writing-a-store.md's row for store/{key} names these files (left), the folder holds these (right)"
            );
        }
        listed.insert(key);
    }
    let stale: Vec<_> = rows.keys().filter(|k| !listed.contains(*k)).collect();
    assert!(
        stale.is_empty(),
        "docs/writing-a-store.md lists what store/ no longer has: {stale:?}"
    );
}

#[test]
fn the_checks_see_what_they_look_for() {
    assert!(speaks_redis("let c: redis::Client = x;"));
    assert!(speaks_redis("use redis::Cmd;"));
    assert!(!speaks_redis("pub use store::redis::keys;"));
    assert!(speaks_redis("fn f(p: &Pinned) {}"));
    assert!(!speaks_redis("struct Unpinned;"));
    assert!(speaks_redis("use super::scripts::renew;"));
    assert_eq!(code("a // b\nc /* d */ e \"// f\""), "a \nc  e \"// f\"");
    assert_eq!(
        spread("crate::store::{Ask, redis::{keys, Conn}}"),
        [
            "crate::store::Ask",
            "crate::store::redis::keys",
            "crate::store::redis::Conn"
        ]
    );
    assert_eq!(module_of("store/redis/mod.rs"), ["store", "redis"]);
}

/// The value of `const NAME: u64 = …;` in the macro crate's `validate.rs`, arithmetic of
/// literals (`30 * 24 * 3600 * 1000`) evaluated.
fn macro_limit(source: &str, name: &str) -> u64 {
    let start = format!("const {name}: u64 = ");
    let line = source
        .lines()
        .find_map(|line| line.trim().strip_prefix(start.as_str()))
        .unwrap_or_else(|| panic!("lock-macros/src/validate.rs has no `{start}…`"));
    line.trim_end_matches(';')
        .split('*')
        .map(|factor| {
            let digits: String = factor.trim().chars().filter(|c| *c != '_').collect();
            digits
                .parse::<u64>()
                .unwrap_or_else(|e| panic!("{name}: `{factor}` is not a number ({e})"))
        })
        .product()
}

/// The macro checks a literal `ttl_ms`, `watchdog` ttl, duration and `permits` at compile time
/// against limits of its own (a proc-macro crate cannot read the runtime's constants): each must
/// be the runtime's, or a literal the macro accepts would fail at run time (or the reverse).
#[test]
fn the_macros_limits_are_the_runtimes() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../lock-macros/src/validate.rs");
    let source = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let ms = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    let limits = [
        ("MIN_TTL_MS", ms(lock_runtime::MIN_TTL)),
        ("MIN_WATCHDOG_TTL_MS", ms(lock_runtime::MIN_WATCHDOG_TTL)),
        ("MAX_MS", ms(lock_runtime::MAX_DURATION)),
        ("MAX_PERMITS", u64::from(lock_runtime::MAX_PERMITS)),
    ];
    for (name, runtime) in limits {
        assert_eq!(
            macro_limit(&source, name),
            runtime,
            "lock-macros/src/validate.rs's {name} is not the runtime's"
        );
    }
    // The reader itself: the arithmetic form is read as its product.
    assert_eq!(macro_limit("const X: u64 = 30 * 24 * 3_600;", "X"), 2_592_000);
}
