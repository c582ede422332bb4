//! Checks the arguments against each other and against the fn, and builds the [`Config`] that
//! expansion reads. Every error points at the token at fault; as many as can be found are
//! reported at once.

use proc_macro2::{Ident, Span};
use syn::spanned::Spanned;
use syn::{Expr, ExprLit, ItemFn, Lit, LitStr, Member, Pat, Path};

use crate::key::{parse_template, Piece};
use crate::parse::{RawArg, RawArgs};

const VALID: &str =
    "key, ttl_ms, ttl, watchdog, wait_ms, wait, fencing, fair, hold_at_least_ms, hold_at_least, \
                     on_lost, options, client, crate";
/// Every argument that sets one of the lock's options; `options = …` gives all of them at once.
const OPTION_ARGS: [&str; 10] = [
    "ttl_ms",
    "ttl",
    "watchdog",
    "wait_ms",
    "wait",
    "fencing",
    "fair",
    "hold_at_least_ms",
    "hold_at_least",
    "on_lost",
];
const DEFAULT_TTL_MS: u64 = 30_000;
// Kept in step with lock_runtime::{MIN_TTL, MIN_WATCHDOG_TTL, MAX_DURATION}.
const MIN_TTL_MS: u64 = 10;
const MIN_WATCHDOG_TTL_MS: u64 = 60;
const MAX_MS: u64 = 30 * 24 * 3600 * 1000;

#[derive(Clone, Copy)]
pub(crate) enum OnLost {
    Abort,
    Continue,
}

/// One part of a checked key template.
pub(crate) enum KeyPart {
    Text(String),
    /// `<root.a.0>`: the parameter's own ident (so it resolves to it), then fields or indexes.
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
    pub(crate) ttl: Millis,
    pub(crate) watchdog: bool,
    pub(crate) wait: Millis,
    pub(crate) fencing: bool,
    pub(crate) fair: bool,
    pub(crate) hold_at_least: Millis,
    pub(crate) on_lost: OnLost,
    /// `options = …`: a whole `LockOptions`, instead of the arguments above.
    pub(crate) options: Option<Expr>,
    pub(crate) client: Option<Expr>,
    pub(crate) krate: Path,
}

/// Arguments as given, each at most once.
#[derive(Default)]
struct Given {
    key: Option<LitStr>,
    ttl_ms: Option<(u64, Span)>,
    watchdog: Option<bool>,
    wait_ms: Option<u64>,
    fencing: Option<bool>,
    fair: Option<bool>,
    hold_at_least_ms: Option<u64>,
    on_lost: Option<OnLost>,
    ttl: Option<Expr>,
    wait: Option<Expr>,
    hold_at_least: Option<Expr>,
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
        return Err(syn::Error::new(
            arg.name.span(),
            format!("duplicate argument `{}`", arg.name),
        ));
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
                once(&mut self.ttl, arg, expr(arg, "a `Duration`")?)?;
            }
            "wait" => {
                exclusive(&self.wait_ms, arg, "wait_ms")?;
                once(&mut self.wait, arg, expr(arg, "a `Duration`")?)?;
            }
            "hold_at_least" => {
                exclusive(&self.hold_at_least_ms, arg, "hold_at_least_ms")?;
                once(&mut self.hold_at_least, arg, expr(arg, "a `Duration`")?)?;
            }
            "options" => {
                if let Some(first) = &self.first_option {
                    return Err(options_conflict(first));
                }
                once(&mut self.options, arg, expr(arg, "a `LockOptions`")?)?;
            }
            "ttl_ms" => exclusive(&self.ttl, arg, "ttl")?,
            "wait_ms" => exclusive(&self.wait, arg, "wait")?,
            "hold_at_least_ms" => exclusive(&self.hold_at_least, arg, "hold_at_least")?,
            _ => {}
        }
        match name.as_str() {
            "ttl" | "wait" | "hold_at_least" | "options" => Ok(()),
            "key" => once(&mut self.key, arg, string(arg)?),
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
            "watchdog" => once(&mut self.watchdog, arg, flag(arg)?),
            "fencing" => once(&mut self.fencing, arg, flag(arg)?),
            "fair" => once(&mut self.fair, arg, flag(arg)?),
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
            other => Err(syn::Error::new(
                arg.name.span(),
                format!("unknown argument `{other}`; valid arguments are: {VALID}"),
            )),
        }
    }
}

fn options_conflict(name: &Ident) -> syn::Error {
    syn::Error::new(
        name.span(),
        format!("`{name}` cannot be given with `options = …`, which gives every option: set it on the `LockOptions` instead"),
    )
}

/// The names a fn's parameters bind, including those inside patterns
/// (`Path(order_id): Path<u64>`, `(a, b): (u8, u8)`, `Order { id, .. }: Order`), and `self`.
pub(crate) fn bindings(item: &ItemFn) -> Vec<Ident> {
    fn walk(pat: &Pat, out: &mut Vec<Ident>) {
        match pat {
            Pat::Ident(p) => {
                out.push(p.ident.clone());
                if let Some((_, sub)) = &p.subpat {
                    walk(sub, out);
                }
            }
            Pat::Struct(p) => p.fields.iter().for_each(|f| walk(&f.pat, out)),
            Pat::TupleStruct(p) => p.elems.iter().for_each(|e| walk(e, out)),
            Pat::Tuple(p) => p.elems.iter().for_each(|e| walk(e, out)),
            Pat::Slice(p) => p.elems.iter().for_each(|e| walk(e, out)),
            Pat::Reference(p) => walk(&p.pat, out),
            Pat::Type(p) => walk(&p.pat, out),
            Pat::Paren(p) => walk(&p.pat, out),
            _ => {}
        }
    }
    let mut out = Vec::new();
    for input in &item.sig.inputs {
        match input {
            syn::FnArg::Receiver(r) => out.push(Ident::new("self", r.self_token.span)),
            syn::FnArg::Typed(t) => walk(&t.pat, &mut out),
        }
    }
    out
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
    if item.sig.asyncness.is_none() {
        push(
            &mut errors,
            syn::Error::new(
                item.sig.fn_token.span,
                "#[distributed_lock] needs an `async fn`: the lock is taken and released around an await",
            ),
        );
    }
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
    let key = match &given.key {
        None => {
            push(
                &mut errors,
                syn::Error::new(
                    Span::call_site(),
                    "missing `key = \"…\"`: the lock's key, as in `key = \"order:<id>\"`",
                ),
            );
            None
        }
        Some(lit) => match check_key(lit, item) {
            Ok(parts) => Some(parts),
            Err(e) => {
                push(&mut errors, e);
                None
            }
        },
    };
    if let Some(e) = errors {
        return Err(e);
    }
    let Some(key) = key else {
        return Err(syn::Error::new(Span::call_site(), "missing `key`"));
    };
    let duration = |expr: Option<Expr>, literal: u64| expr.map_or(Millis::Literal(literal), Millis::Expr);
    Ok(Config {
        key,
        ttl: duration(given.ttl, ttl_ms),
        watchdog,
        wait: duration(given.wait, given.wait_ms.unwrap_or(0)),
        fencing: given.fencing.unwrap_or(false),
        fair: given.fair.unwrap_or(false),
        hold_at_least: duration(given.hold_at_least, given.hold_at_least_ms.unwrap_or(0)),
        on_lost: given.on_lost.unwrap_or(OnLost::Abort),
        options: given.options,
        client: given.client,
        krate: given.krate.unwrap_or_else(|| syn::parse_quote!(::lock_runtime)),
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
    for piece in pieces {
        let path = match piece {
            Piece::Text(text) => {
                parts.push(KeyPart::Text(text));
                continue;
            }
            Piece::Placeholder(path) => path,
        };
        let Some(root) = names.iter().find(|n| **n == path[0]) else {
            let known: Vec<String> = names.iter().map(ToString::to_string).collect();
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
                Member::Named(ident) => ident.set_span(lit.span()),
                Member::Unnamed(index) => index.span = lit.span(),
            }
            fields.push(member);
        }
        parts.push(KeyPart::Value {
            root: root.clone(),
            fields,
        });
    }
    Ok(parts)
}
