//! Checks the arguments against each other and against the fn, and builds the [`Config`] that
//! expansion reads. Every error points at the token at fault; as many as can be found are
//! reported at once.

use proc_macro2::{Ident, Span};
use syn::spanned::Spanned;
use syn::{Expr, ExprLit, ItemFn, Lit, LitStr, Member, Pat, Path, Type};

use crate::boxed;
use crate::key::{braced, parse_template, Braced, Piece};
use crate::parse::{RawArg, RawArgs};
use crate::suggest::closest;

/// Every argument, in the order the reference lists them.
const ARGS: [&str; 20] = [
    "key",
    "keys",
    "ttl_ms",
    "ttl",
    "watchdog",
    "wait_ms",
    "wait",
    "fencing",
    "fair",
    "hold_at_least_ms",
    "hold_at_least",
    "hold_at_most_ms",
    "hold_at_most",
    "on_lost",
    "read",
    "write",
    "permits",
    "options",
    "client",
    "crate",
];
/// Every argument that sets one of the lock's options; `options = …` gives all of them at once.
const OPTION_ARGS: [&str; 15] = [
    "ttl_ms",
    "ttl",
    "watchdog",
    "wait_ms",
    "wait",
    "fencing",
    "fair",
    "hold_at_least_ms",
    "hold_at_least",
    "hold_at_most_ms",
    "hold_at_most",
    "on_lost",
    "read",
    "write",
    "permits",
];
const DEFAULT_TTL_MS: u64 = 30_000;
// The runtime's lock_runtime::{MIN_TTL, MIN_WATCHDOG_TTL, MAX_DURATION} in ms (the tests' layout.rs
// fails when they differ).
const MIN_TTL_MS: u64 = 10;
const MIN_WATCHDOG_TTL_MS: u64 = 60;
const MAX_MS: u64 = 30 * 24 * 3600 * 1000;
// The runtime's lock_runtime::MAX_PERMITS (checked likewise).
const MAX_PERMITS: u64 = 1024;

#[derive(Clone, Copy)]
pub(crate) enum OnLost {
    Abort,
    Continue,
}

/// `read` (a shared lock) or `write` (an exclusive one, as without either).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Shared,
    Exclusive,
}

/// What kind of fn is guarded.
pub(crate) enum Form {
    /// An `async fn`: its body is guarded.
    Async,
    /// A fn returning `Pin<Box<dyn Future<Output = R>>>` whose body is `Box::pin(async move {…})`,
    /// as `#[async_trait]` writes a method before this attribute sees it (see [`boxed`]).
    Boxed {
        /// `R`, the future's output: what the fn gives its callers.
        output: Box<Type>,
    },
}

/// One part of a checked key template.
#[derive(Clone)]
pub(crate) enum KeyPart {
    Text(String),
    /// `<root.a.0>`: the parameter's name, then fields or indexes, all spanned on the key.
    Value {
        root: Ident,
        fields: Vec<Member>,
    },
}

/// A duration: an integer literal of milliseconds (`ttl_ms = 30000`), or a `Duration`
/// expression (`ttl = TTL`), checked by the compiler where it is written.
pub(crate) enum Millis {
    Literal(u64),
    Expr(Expr),
}

/// Everything expansion needs, checked.
pub(crate) struct Config {
    pub(crate) key: Vec<KeyPart>,
    /// `keys = ["…", …]`: a multi-key set, every template (`key` is the first).
    pub(crate) keys: Option<Vec<Vec<KeyPart>>>,
    pub(crate) ttl: Millis,
    pub(crate) watchdog: bool,
    pub(crate) wait: Millis,
    pub(crate) fencing: bool,
    pub(crate) fair: bool,
    pub(crate) hold_at_least: Millis,
    /// `hold_at_most_ms`/`hold_at_most`: none unless given.
    pub(crate) hold_at_most: Option<Millis>,
    pub(crate) on_lost: OnLost,
    /// `read` or `write`; neither leaves the runtime's default (exclusive).
    pub(crate) mode: Option<Mode>,
    /// `permits = N` or `permits = EXPR` (a `u32`); none leaves the runtime's default (1).
    pub(crate) permits: Option<Expr>,
    /// `options = …`: a whole `LockOptions`, instead of the arguments above.
    pub(crate) options: Option<Expr>,
    pub(crate) client: Option<Expr>,
    pub(crate) krate: Path,
    pub(crate) form: Form,
}

/// Arguments as given, each at most once.
#[derive(Default)]
struct Given {
    key: Option<LitStr>,
    /// `keys = [...]`: its templates, and the argument's name (for the error with `key`).
    keys: Option<(Vec<LitStr>, Ident)>,
    /// `key` or `keys` was written (valid or not): no "missing key" error then.
    key_named: bool,
    ttl_ms: Option<(u64, Span)>,
    watchdog: Option<bool>,
    wait_ms: Option<u64>,
    fencing: Option<bool>,
    fair: Option<bool>,
    hold_at_least_ms: Option<u64>,
    hold_at_most_ms: Option<(u64, Span)>,
    on_lost: Option<OnLost>,
    /// The mode and the argument that set it (`read` or `write`).
    mode: Option<(Mode, Ident)>,
    /// `permits = …`, and its name (for the error when `read`/`write` follows).
    permits: Option<(Expr, Ident)>,
    ttl: Option<Expr>,
    wait: Option<Expr>,
    hold_at_least: Option<Expr>,
    hold_at_most: Option<Expr>,
    options: Option<Expr>,
    /// The first option argument given, for the error when `options` is given too.
    first_option: Option<Ident>,
    client: Option<Expr>,
    krate: Option<Path>,
}

/// Adds `e` to the errors found so far.
fn push(errors: &mut Option<syn::Error>, e: syn::Error) {
    match errors {
        Some(all) => all.combine(e),
        None => *errors = Some(e),
    }
}

fn once<T>(slot: &mut Option<T>, arg: &RawArg, value: T) -> syn::Result<()> {
    if slot.is_some() {
        return Err(duplicate(&arg.name));
    }
    *slot = Some(value);
    Ok(())
}

fn lit(arg: &RawArg) -> syn::Result<&Lit> {
    match &arg.value {
        Some(Expr::Lit(ExprLit { lit, .. })) => Ok(lit),
        Some(other) => Err(syn::Error::new(
            other.span(),
            format!("`{}` takes a literal", arg.name),
        )),
        None => Err(syn::Error::new(
            arg.name.span(),
            format!("`{}` needs a value", arg.name),
        )),
    }
}

fn millis(arg: &RawArg) -> syn::Result<(u64, Span)> {
    let not_millis = |span: Span| {
        syn::Error::new(
            span,
            format!(
                "`{}` takes an integer literal: a number of milliseconds, as in `{} = 30000`",
                arg.name, arg.name
            ),
        )
    };
    let int = match &arg.value {
        Some(Expr::Lit(ExprLit {
            lit: Lit::Int(int), ..
        })) => int,
        Some(other) => return Err(not_millis(other.span())),
        None => return Err(not_millis(arg.name.span())),
    };
    let ms: u64 = int.base10_parse()?;
    if ms > MAX_MS {
        return Err(syn::Error::new(
            int.span(),
            format!("`{}` is over 30 days ({MAX_MS} ms)", arg.name),
        ));
    }
    Ok((ms, int.span()))
}

fn flag(arg: &RawArg) -> syn::Result<bool> {
    if arg.value.is_none() {
        return Ok(true);
    }
    match lit(arg)? {
        Lit::Bool(b) => Ok(b.value),
        other => Err(syn::Error::new(
            other.span(),
            format!(
                "`{}` is a flag: write `{}` or `{} = false`",
                arg.name, arg.name, arg.name
            ),
        )),
    }
}

fn string(arg: &RawArg) -> syn::Result<LitStr> {
    match lit(arg)? {
        Lit::Str(s) => Ok(s.clone()),
        other => Err(syn::Error::new(
            other.span(),
            format!("`{}` takes a string literal", arg.name),
        )),
    }
}

fn expr(arg: &RawArg, what: &str) -> syn::Result<Expr> {
    arg.value.clone().ok_or_else(|| {
        syn::Error::new(
            arg.name.span(),
            format!("`{}` needs {what}, as in `{} = …`", arg.name, arg.name),
        )
    })
}

/// The `Duration` of `ttl`/`wait`/`hold_at_*`; an integer literal there is refused at the
/// literal with the `_ms` form it most likely meant (`ttl = 5000` → `ttl_ms = 5000`).
fn duration(arg: &RawArg) -> syn::Result<Expr> {
    let value = expr(arg, "a `Duration`")?;
    if let Expr::Lit(ExprLit {
        lit: Lit::Int(int), ..
    }) = &value
    {
        let name = &arg.name;
        return Err(syn::Error::new(
            int.span(),
            format!(
                "`{name}` takes a `Duration` (`{name} = Duration::from_secs(5)`); for \
                 milliseconds, write `{name}_ms = {int}`"
            ),
        ));
    }
    Ok(value)
}

/// `second` cannot be given with `first` (both set the same option).
fn exclusive(first: &Option<impl Sized>, second: &RawArg, first_name: &str) -> syn::Result<()> {
    if first.is_some() {
        return Err(syn::Error::new(
            second.name.span(),
            format!(
                "`{}` and `{first_name}` both set the same option: keep one",
                second.name
            ),
        ));
    }
    Ok(())
}

impl Given {
    fn set(&mut self, arg: &RawArg) -> syn::Result<()> {
        let name = arg.name.to_string();
        if OPTION_ARGS.contains(&name.as_str()) {
            if self.options.is_some() {
                return Err(options_conflict(&arg.name));
            }
            self.first_option.get_or_insert_with(|| arg.name.clone());
        }
        match name.as_str() {
            "ttl" => {
                exclusive(&self.ttl_ms, arg, "ttl_ms")?;
                once(&mut self.ttl, arg, duration(arg)?)?;
            }
            "wait" => {
                exclusive(&self.wait_ms, arg, "wait_ms")?;
                once(&mut self.wait, arg, duration(arg)?)?;
            }
            "hold_at_least" => {
                exclusive(&self.hold_at_least_ms, arg, "hold_at_least_ms")?;
                self.not_with_read(arg)?;
                once(&mut self.hold_at_least, arg, duration(arg)?)?;
            }
            "hold_at_most" => {
                exclusive(&self.hold_at_most_ms, arg, "hold_at_most_ms")?;
                once(&mut self.hold_at_most, arg, duration(arg)?)?;
            }
            "options" => {
                if let Some(first) = &self.first_option {
                    return Err(options_conflict(first));
                }
                once(&mut self.options, arg, expr(arg, "a `LockOptions`")?)?;
            }
            "ttl_ms" => exclusive(&self.ttl, arg, "ttl")?,
            "hold_at_most_ms" => exclusive(&self.hold_at_most, arg, "hold_at_most")?,
            "wait_ms" => exclusive(&self.wait, arg, "wait")?,
            "hold_at_least_ms" => {
                exclusive(&self.hold_at_least, arg, "hold_at_least")?;
                self.not_with_read(arg)?;
            }
            _ => {}
        }
        match name.as_str() {
            "ttl" | "wait" | "hold_at_least" | "hold_at_most" | "options" => Ok(()),
            "key" => {
                self.key_named = true;
                if let Some((_, keys)) = &self.keys {
                    return Err(key_and_keys(&arg.name, keys));
                }
                once(&mut self.key, arg, string(arg)?)
            }
            "keys" => {
                self.key_named = true;
                if self.key.is_some() {
                    return Err(key_and_keys(&arg.name, &arg.name));
                }
                let templates = templates(arg)?;
                once(&mut self.keys, arg, (templates, arg.name.clone()))
            }
            "ttl_ms" => {
                let (ms, span) = millis(arg)?;
                if ms == 0 {
                    return Err(syn::Error::new(span, "`ttl_ms` must be greater than 0"));
                }
                if ms < MIN_TTL_MS {
                    return Err(syn::Error::new(
                        span,
                        format!("`ttl_ms` must be at least {MIN_TTL_MS}"),
                    ));
                }
                once(&mut self.ttl_ms, arg, (ms, span))
            }
            "wait_ms" => once(&mut self.wait_ms, arg, millis(arg)?.0),
            "hold_at_least_ms" => once(&mut self.hold_at_least_ms, arg, millis(arg)?.0),
            "hold_at_most_ms" => once(&mut self.hold_at_most_ms, arg, millis(arg)?),
            "watchdog" => once(&mut self.watchdog, arg, flag(arg)?),
            "fencing" => once(&mut self.fencing, arg, flag(arg)?),
            "fair" => {
                let fair = flag(arg)?;
                if fair {
                    self.not_with_read(arg)?;
                }
                once(&mut self.fair, arg, fair)
            }
            "read" | "write" => self.set_mode(arg),
            "permits" => {
                if let Some((_, mode)) = &self.mode {
                    return Err(permits_conflict(&arg.name, mode));
                }
                let value = permits(arg)?;
                once(&mut self.permits, arg, (value, arg.name.clone()))
            }
            "on_lost" => {
                let s = string(arg)?;
                let policy = match s.value().as_str() {
                    "abort" => OnLost::Abort,
                    "continue" => OnLost::Continue,
                    _ => {
                        return Err(syn::Error::new(
                            s.span(),
                            "`on_lost` is \"abort\" (the default) or \"continue\"",
                        ))
                    }
                };
                once(&mut self.on_lost, arg, policy)
            }
            "client" => match &arg.value {
                Some(expr) => once(&mut self.client, arg, expr.clone()),
                None => Err(syn::Error::new(
                    arg.name.span(),
                    "`client` needs an expression giving a LockClient, as in `client = self.locks`",
                )),
            },
            "crate" => {
                let s = string(arg)?;
                once(&mut self.krate, arg, s.parse::<Path>()?)
            }
            other => Err(unknown(&arg.name, other)),
        }
    }

    fn is_read(&self) -> bool {
        matches!(self.mode, Some((Mode::Shared, _)))
    }

    /// `read` or `write`. Pointed at the second of two conflicting arguments.
    fn set_mode(&mut self, arg: &RawArg) -> syn::Result<()> {
        let mode = match (arg.name == "read", flag(arg)?) {
            (true, true) => Mode::Shared,
            (true, false) | (false, true) => Mode::Exclusive,
            (false, false) => {
                return Err(syn::Error::new(
                    arg.value.span(),
                    "`write = false` would be a read lock: write `read` instead",
                ))
            }
        };
        if let Some((_, permits)) = &self.permits {
            return Err(permits_conflict(&arg.name, permits));
        }
        if let Some((_, first)) = &self.mode {
            if *first == arg.name {
                return Err(duplicate(&arg.name));
            }
            return Err(syn::Error::new(
                arg.name.span(),
                format!(
                    "`{}` and `{first}` both set the lock's mode: keep one (`read` for a shared lock; \
                     `write`, or neither, for an exclusive one)",
                    arg.name
                ),
            ));
        }
        if mode == Mode::Shared {
            if self.fair == Some(true) {
                return Err(read_conflict(&arg.name, "fair"));
            }
            if self.hold_at_least_ms.is_some() {
                return Err(read_conflict(&arg.name, "hold_at_least_ms"));
            }
            if self.hold_at_least.is_some() {
                return Err(read_conflict(&arg.name, "hold_at_least"));
            }
        }
        self.mode = Some((mode, arg.name.clone()));
        Ok(())
    }

    /// Refuses `arg` (`fair`, a minimum hold) after `read`.
    fn not_with_read(&self, arg: &RawArg) -> syn::Result<()> {
        if self.is_read() {
            return Err(read_conflict(&arg.name, &arg.name.to_string()));
        }
        Ok(())
    }
}

/// `keys = ["…", …]`: one string literal per key template, at least one.
fn templates(arg: &RawArg) -> syn::Result<Vec<LitStr>> {
    let usage =
        "`keys` takes an array of key templates, as in `keys = [\"account:<from>\", \"account:<to>\"]`";
    let Some(Expr::Array(array)) = &arg.value else {
        let span = arg.value.as_ref().map_or(arg.name.span(), Spanned::span);
        return Err(syn::Error::new(span, usage));
    };
    if array.elems.is_empty() {
        return Err(syn::Error::new(
            array.span(),
            "`keys` needs at least one key template",
        ));
    }
    array
        .elems
        .iter()
        .map(|elem| match elem {
            Expr::Lit(ExprLit { lit: Lit::Str(s), .. }) => Ok(s.clone()),
            other => Err(syn::Error::new(other.span(), usage)),
        })
        .collect()
}

/// `key` together with `keys`, reported at `at` (whichever came second).
fn key_and_keys(at: &Ident, _other: &Ident) -> syn::Error {
    syn::Error::new(
        at.span(),
        "`key` and `keys` cannot be given together: `key` names one lock, `keys = [...]` a set of them",
    )
}

/// `permits = N` (an integer literal from 1 to the maximum) or `permits = EXPR` (a `u32`,
/// checked by the compiler where it is written, and by the runtime).
fn permits(arg: &RawArg) -> syn::Result<Expr> {
    let value = expr(arg, "a number of permits")?;
    if let Expr::Lit(ExprLit {
        lit: Lit::Int(int), ..
    }) = &value
    {
        let n: u64 = int.base10_parse()?;
        if n == 0 {
            return Err(syn::Error::new(
                int.span(),
                "`permits` must be at least 1 (1 is the ordinary lock)",
            ));
        }
        if n > MAX_PERMITS {
            return Err(syn::Error::new(
                int.span(),
                format!("`permits` is at most {MAX_PERMITS}"),
            ));
        }
    }
    Ok(value)
}

/// `permits` together with `read`/`write`, reported at `at` (whichever came second).
fn permits_conflict(at: &Ident, other: &Ident) -> syn::Error {
    let (permits, mode) = if at == "permits" { (at, other) } else { (other, at) };
    syn::Error::new(
        at.span(),
        format!(
            "`{permits}` and `{mode}` cannot be given together: a semaphore's holders are counted \
             permits, not readers and writers"
        ),
    )
}

/// `read` together with `other`, reported at `at` (whichever of the two came second).
fn read_conflict(at: &Ident, other: &str) -> syn::Error {
    let why = if other == "fair" {
        "a read lock cannot be fair yet: waiting writers are preferred over new readers, so \
         `read` and `fair` cannot be given together"
            .to_owned()
    } else {
        format!(
            "`read` and `{other}` cannot be given together: a minimum hold keeps others out, and \
             readers do not exclude each other"
        )
    };
    syn::Error::new(at.span(), why)
}

fn duplicate(name: &Ident) -> syn::Error {
    syn::Error::new(name.span(), format!("duplicate argument `{name}`"))
}

/// An argument that does not exist: the valid ones, and the closest of them when it looks like
/// a misspelling.
fn unknown(name: &Ident, written: &str) -> syn::Error {
    let valid = ARGS.join(", ");
    let message = match closest(written, &ARGS) {
        Some(meant) => {
            format!("unknown argument `{written}`: did you mean `{meant}`? (valid arguments are: {valid})")
        }
        None => format!("unknown argument `{written}`; valid arguments are: {valid}"),
    };
    syn::Error::new(name.span(), message)
}

fn options_conflict(name: &Ident) -> syn::Error {
    syn::Error::new(
        name.span(),
        format!("`{name}` cannot be given with `options = …`, which gives every option: set it on the `LockOptions` instead"),
    )
}

/// The names a fn's parameters bind, including those inside patterns
/// (`Path(order_id): Path<u64>`, `(a, b): (u8, u8)`, `Order { id, .. }: Order`), and `self`; for
/// a boxed-future fn, also those async_trait binds before the body.
pub(crate) fn bindings(item: &ItemFn) -> Vec<Ident> {
    let mut out = Vec::new();
    for input in &item.sig.inputs {
        match input {
            syn::FnArg::Receiver(r) => out.push(Ident::new("self", r.self_token.span)),
            syn::FnArg::Typed(t) => pattern_names(&t.pat, &mut out),
        }
    }
    if item.sig.asyncness.is_none() {
        if let Some(body) = boxed::body_mut(&mut item.block.clone()) {
            body.rebound.iter().for_each(|pat| pattern_names(pat, &mut out));
        }
    }
    out
}

/// The names `pat` binds.
fn pattern_names(pat: &Pat, out: &mut Vec<Ident>) {
    match pat {
        Pat::Ident(p) => {
            if !out.contains(&p.ident) {
                out.push(p.ident.clone());
            }
            if let Some((_, sub)) = &p.subpat {
                pattern_names(sub, out);
            }
        }
        Pat::Struct(p) => p.fields.iter().for_each(|f| pattern_names(&f.pat, out)),
        Pat::TupleStruct(p) => p.elems.iter().for_each(|e| pattern_names(e, out)),
        Pat::Tuple(p) => p.elems.iter().for_each(|e| pattern_names(e, out)),
        Pat::Slice(p) => p.elems.iter().for_each(|e| pattern_names(e, out)),
        Pat::Reference(p) => pattern_names(&p.pat, out),
        Pat::Type(p) => pattern_names(&p.pat, out),
        Pat::Paren(p) => pattern_names(&p.pat, out),
        _ => {}
    }
}

/// Checks the arguments and the fn; `Err` holds every problem found.
pub(crate) fn validate(args: RawArgs, item: &ItemFn) -> syn::Result<Config> {
    let mut errors = None;
    if let Some(constness) = &item.sig.constness {
        push(
            &mut errors,
            syn::Error::new(constness.span, "#[distributed_lock] cannot guard a `const fn`"),
        );
    }
    let form = match form(item) {
        Ok(form) => Some(form),
        Err(e) => {
            push(&mut errors, e);
            None
        }
    };
    let mut given = Given::default();
    for arg in &args.0 {
        if let Err(e) = given.set(arg) {
            push(&mut errors, e);
        }
    }
    let ttl_ms = given.ttl_ms.map_or(DEFAULT_TTL_MS, |(ms, _)| ms);
    let watchdog = given.watchdog.unwrap_or(false);
    if watchdog && given.ttl.is_none() && ttl_ms < MIN_WATCHDOG_TTL_MS {
        let span = given.ttl_ms.map_or_else(Span::call_site, |(_, span)| span);
        push(
            &mut errors,
            syn::Error::new(
                span,
                format!(
                    "`ttl_ms` must be at least {MIN_WATCHDOG_TTL_MS} with `watchdog` (it renews every ttl/3)"
                ),
            ),
        );
    }
    if let (Some((most, span)), None) = (given.hold_at_most_ms, &given.ttl) {
        if most < ttl_ms {
            push(
                &mut errors,
                syn::Error::new(
                    span,
                    format!(
                        "`hold_at_most_ms` must be at least the ttl ({ttl_ms} ms): the first lease \
                         would already outlast it"
                    ),
                ),
            );
        }
    }
    let templates: Vec<&LitStr> = match (&given.key, &given.keys) {
        (Some(lit), _) => vec![lit],
        (None, Some((lits, _))) => lits.iter().collect(),
        (None, None) if given.key_named => Vec::new(),
        (None, None) => {
            push(
                &mut errors,
                syn::Error::new(
                    Span::call_site(),
                    "missing `key = \"…\"`: the lock's key, as in `key = \"order:<id>\"` (or \
                     `keys = [\"…\", …]` for a set of locks)",
                ),
            );
            Vec::new()
        }
    };
    let mut checked = Vec::new();
    for lit in templates {
        match check_key(lit, item) {
            Ok(parts) => checked.push(parts),
            Err(e) => push(&mut errors, e),
        }
    }
    let set = given.keys.is_some();
    let mut checked = checked.into_iter();
    let key = checked.next();
    let keys = set.then(|| key.iter().cloned().chain(checked).collect::<Vec<_>>());
    if let Some(e) = errors {
        return Err(e);
    }
    let (Some(key), Some(form)) = (key, form) else {
        return Err(syn::Error::new(Span::call_site(), "missing `key`"));
    };
    let duration = |expr: Option<Expr>, literal: u64| expr.map_or(Millis::Literal(literal), Millis::Expr);
    Ok(Config {
        key,
        keys,
        ttl: duration(given.ttl, ttl_ms),
        watchdog,
        wait: duration(given.wait, given.wait_ms.unwrap_or(0)),
        fencing: given.fencing.unwrap_or(false),
        fair: given.fair.unwrap_or(false),
        hold_at_least: duration(given.hold_at_least, given.hold_at_least_ms.unwrap_or(0)),
        hold_at_most: given
            .hold_at_most
            .map(Millis::Expr)
            .or(given.hold_at_most_ms.map(|(ms, _)| Millis::Literal(ms))),
        on_lost: given.on_lost.unwrap_or(OnLost::Abort),
        mode: given.mode.map(|(mode, _)| mode),
        permits: given.permits.map(|(permits, _)| permits),
        options: given.options,
        client: given.client,
        krate: given.krate.unwrap_or_else(|| syn::parse_quote!(::lock_runtime)),
        form,
    })
}

/// An `async fn`, or what `#[async_trait]` made of one.
fn form(item: &ItemFn) -> syn::Result<Form> {
    if item.sig.asyncness.is_some() {
        return Ok(Form::Async);
    }
    let Some(output) = boxed::future_output(&item.sig.output) else {
        return Err(syn::Error::new(
            item.sig.fn_token.span,
            "#[distributed_lock] needs an `async fn`: the lock is taken and released around an await",
        ));
    };
    if boxed::body_mut(&mut item.block.clone()).is_none() {
        return Err(syn::Error::new(
            item.sig.fn_token.span,
            "#[distributed_lock] guards an `async fn`, or a fn returning a boxed future whose body is \
             `Box::pin(async move { … })` (what #[async_trait] makes of a method); this body is \
             neither",
        ));
    }
    Ok(Form::Boxed {
        output: Box::new(output.clone()),
    })
}

fn check_key(lit: &LitStr, item: &ItemFn) -> syn::Result<Vec<KeyPart>> {
    let template = lit.value();
    if template.is_empty() {
        return Err(syn::Error::new(lit.span(), "the key template is empty"));
    }
    let pieces = parse_template(&template).map_err(|msg| syn::Error::new(lit.span(), msg))?;
    let names = bindings(item);
    let mut parts = Vec::with_capacity(pieces.len());
    // Placeholder tokens are located at the literal (an error there, as "no field `idd`", points
    // at the key) but resolved at the call site: a span from a macro expansion is one rustc puts
    // no suggestion on, so no "a field with a similar name exists" rewrites the literal.
    let at_key = Span::call_site().located_at(lit.span());
    for piece in pieces {
        let path = match piece {
            Piece::Text(text) => {
                // The `format!` habit: `{id}` would be the same text on every call, so every
                // call would share one lock. Other braces (JSON-like keys, `{}`) stay literal.
                let names_a_parameter = |b: &Braced| names.iter().any(|n| *n == b.path[0]);
                if let Some(habit) = braced(&text).into_iter().find(names_a_parameter) {
                    let path = habit.path.join(".");
                    return Err(syn::Error::new(
                        lit.span(),
                        format!(
                            "`{{{}}}` in the key is literal text, so every call would share one lock: \
                             write `<{path}>` for the value of `{path}`",
                            habit.written
                        ),
                    ));
                }
                parts.push(KeyPart::Text(text));
                continue;
            }
            Piece::Placeholder(path) => path,
        };
        let Some(root) = names.iter().find(|n| **n == path[0]) else {
            // Not the names async_trait made up (`__self`, `__arg1`).
            let known: Vec<String> = names
                .iter()
                .map(ToString::to_string)
                .filter(|n| !n.starts_with("__"))
                .collect();
            return Err(syn::Error::new(
                lit.span(),
                format!(
                    "`<{}>` in the key names no parameter of this fn (parameters: {})",
                    path.join("."),
                    if known.is_empty() {
                        "none".to_owned()
                    } else {
                        known.join(", ")
                    }
                ),
            ));
        };
        let mut fields = Vec::with_capacity(path.len() - 1);
        for segment in &path[1..] {
            let mut member: Member = syn::parse_str(segment).map_err(|_| {
                syn::Error::new(
                    lit.span(),
                    format!(
                        "`{segment}` in `<{}>` is not a field name or a tuple index",
                        path.join(".")
                    ),
                )
            })?;
            match &mut member {
                Member::Named(ident) => ident.set_span(at_key),
                Member::Unnamed(index) => index.span = at_key,
            }
            fields.push(member);
        }
        let mut root = root.clone();
        root.set_span(at_key);
        parts.push(KeyPart::Value { root, fields });
    }
    Ok(parts)
}
