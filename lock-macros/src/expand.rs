//! Writes the guarded fn. The signature stays as written (an `async fn`, with its attributes);
//! the body becomes:
//!
//! ```text
//! let key = format!(<template>, <placeholders>);   // before the body owns the arguments
//! let client = Some(ClientRef::lock_client(&(<client expr>)));   // or None: the default client
//! let options = LockOptions::new(..)...;   // or IntoLockOptions::into_lock_options(<options expr>)
//! match __private::run("<module path>::<fn>", client, key, options, async move { <body> }).await {
//!     Ok(out) => out,                       // the body's own return value, whatever it was
//!     Err(e) => __private::lock_failed(e),  // Err(E::from(LockError))
//! }
//! ```
//!
//! `return` and `?` in the body land in the inner `async move` block, so every exit of the body
//! comes back through `run`, which releases the lock before the fn returns; a panic or a dropped
//! future releases through the guard's `Drop`. Generated names use `Span::mixed_site()`, so user
//! code can neither see nor shadow them.
//!
//! A method of an `#[async_trait]` impl arrives already rewritten (see [`crate::boxed`]): there the
//! same guarded block replaces the method's body inside async_trait's `Box::pin(async move { … })`.

use proc_macro2::{Ident, Span, TokenStream, TokenTree};
use quote::{quote, quote_spanned, ToTokens};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::visit::Visit;
use syn::{GenericArgument, ItemFn, PathArguments, ReturnType, Type};

use crate::boxed;
use crate::parse::RawArgs;
use crate::validate::{validate, Config, Form, KeyPart, Millis, Mode, OnLost};

/// The attribute's entry point. On any error, the item is emitted unchanged next to the errors,
/// so the rest of the crate still type-checks and IDEs keep working.
pub(crate) fn distributed_lock(args: TokenStream, item: TokenStream) -> TokenStream {
    let parsed = syn::parse2::<ItemFn>(item.clone()).and_then(|item_fn| {
        let args = syn::parse2::<RawArgs>(args)?;
        let config = validate(args, &item_fn)?;
        expand(config, item_fn)
    });
    match parsed {
        Ok(tokens) => tokens,
        Err(e) => {
            let errors = e.to_compile_error();
            quote!(#errors #item)
        }
    }
}

fn hidden(name: &str) -> Ident {
    Ident::new(name, Span::mixed_site())
}

fn expand(mut config: Config, mut item: ItemFn) -> syn::Result<TokenStream> {
    // The block to guard, and the type its value has (the fn's callers get it).
    let (target, output) = match &config.form {
        Form::Async => {
            let output = match &item.sig.output {
                ReturnType::Type(_, ty) => Some(&**ty),
                ReturnType::Default => None,
            };
            (&mut *item.block, output)
        }
        Form::Boxed { output } => {
            let Some(body) = boxed::body_mut(&mut item.block) else {
                return Err(syn::Error::new(
                    item.sig.fn_token.span,
                    "#[distributed_lock] lost track of this boxed future's body",
                ));
            };
            if body.self_renamed {
                // The body names `self` as `__self` from where it runs; so must the attribute.
                let exprs = [&mut config.client, &mut config.options];
                exprs.into_iter().flatten().for_each(boxed::rename_self);
                let most = config.hold_at_most.as_mut();
                for millis in [&mut config.ttl, &mut config.wait, &mut config.hold_at_least]
                    .into_iter()
                    .chain(most)
                {
                    if let Millis::Expr(expr) = millis {
                        boxed::rename_self(expr);
                    }
                }
                let set = config.keys.iter_mut().flatten();
                for part in std::iter::once(&mut config.key).chain(set).flatten() {
                    if let KeyPart::Value { root, .. } = part {
                        if *root == "self" {
                            *root = Ident::new("__self", root.span());
                        }
                    }
                }
            }
            (body.block, Some(&**output))
        }
    };

    let krate = &config.krate;
    let private = quote!(#krate::__private);
    let (format, placeholders) = key_format(&config.key);
    let (key, client, options, out, err) = (
        hidden("__lock_key"),
        hidden("__lock_client"),
        hidden("__lock_options"),
        hidden("__lock_out"),
        hidden("__lock_err"),
    );
    let client_expr = match &config.client {
        Some(expr) => {
            // Spanned on the expression, so a wrong type is reported there.
            let lock_client = respan(quote!(#private::ClientRef::lock_client), expr.span());
            quote_spanned!(expr.span()=> ::core::option::Option::Some(#lock_client(&(#expr))))
        }
        None => quote!(::core::option::Option::None),
    };
    let options_expr = match &config.options {
        // Spanned on the expression, so a wrong type is reported there.
        Some(expr) => {
            let into = respan(quote!(#private::IntoLockOptions::into_lock_options), expr.span());
            quote_spanned!(expr.span()=> #into(#expr))
        }
        None => {
            let (watchdog, fencing, fair) = (config.watchdog, config.fencing, config.fair);
            let on_lost = match config.on_lost {
                OnLost::Abort => quote!(#private::OnLost::Abort),
                OnLost::Continue => quote!(#private::OnLost::Continue),
            };
            let (ttl, wait, hold) = (
                duration(&private, &config.ttl),
                duration(&private, &config.wait),
                duration(&private, &config.hold_at_least),
            );
            let most = config.hold_at_most.as_ref().map(|most| {
                let most = duration(&private, most);
                quote!(.hold_at_most(#most))
            });
            // Only when asked: without `read`/`write`, the runtime's default (exclusive).
            let mode = match config.mode {
                Some(Mode::Shared) => quote!(.mode(#private::LockMode::Shared)),
                Some(Mode::Exclusive) => quote!(.mode(#private::LockMode::Exclusive)),
                None => quote!(),
            };
            // Only when asked: without it, the runtime's default (1, the ordinary lock).
            let permits = config.permits.as_ref().map(|n| quote!(.permits(#n)));
            quote! {
                #private::LockOptions::new(#ttl)
                    .watchdog(#watchdog)
                    .wait(#wait)
                    .fencing(#fencing)
                    .fair(#fair)
                    .hold_at_least(#hold)
                    .on_lost(#on_lost)
                    #most
                    #mode
                    #permits
            }
        }
    };

    // A failed lock becomes the fn's error through `E: From<LockError>`. The check is spanned on
    // `E` when the return type spells it (`Result<T, E>`), else on the whole return type, so a
    // wrong one is reported there, with the message of `__private::FromLockError`.
    let ret_span = match output {
        Some(ty) => error_type(ty).unwrap_or(ty).span(),
        None => item.sig.ident.span(),
    };
    let lock_failed = respan(quote!(#private::lock_failed), ret_span);
    let failed = quote_spanned!(ret_span=> #lock_failed(#err));

    // Fixes the inner block's type to the fn's return type up front, so `?` and `return` in the
    // body infer as they would without the attribute (the trick tracing-attributes uses).
    let anchor = match output {
        Some(ty) if !has_impl_trait(ty) => {
            let ret = hidden("__lock_ret");
            quote! {
                #[allow(unreachable_code, clippy::diverging_sub_expression, clippy::empty_loop)]
                if false {
                    let #ret: #ty = loop {};
                    return #ret;
                }
            }
        }
        _ => quote!(),
    };

    // One key, or a set of them (`keys = [...]`, run by `run_all`).
    let (key_expr, run) = match &config.keys {
        None => (quote!(::std::format!(#format #(, #placeholders)*)), quote!(run)),
        Some(set) => {
            let each = set.iter().map(|parts| {
                let (format, placeholders) = key_format(parts);
                quote!(::std::format!(#format #(, #placeholders)*))
            });
            (quote!(::std::vec![#(#each),*]), quote!(run_all))
        }
    };

    // The fn's path, named in the refusals of its key and options.
    let name = item.sig.ident.unraw().to_string();
    let call = quote!(::core::concat!(::core::module_path!(), "::", #name));

    // The body's statements, not its block: pasted with its braces as the tail of another block,
    // a one-line body would trip `unused_braces` in the user's crate.
    let stmts = &target.stmts;
    let body = quote! {{
        let #key = #key_expr;
        let #client = #client_expr;
        let #options = #options_expr;
        match #private::#run(#call, #client, #key, #options, async move { #anchor #(#stmts)* }).await {
            ::core::result::Result::Ok(#out) => #out,
            ::core::result::Result::Err(#err) => #failed,
        }
    }};
    *target = syn::parse2(body)?;
    Ok(item.into_token_stream())
}

/// `E` of a return type written `Result<T, E>` (any path whose last segment has two type
/// arguments); `None` for aliases such as `anyhow::Result<T>`.
fn error_type(ty: &Type) -> Option<&Type> {
    let Type::Path(path) = ty else {
        return None;
    };
    let PathArguments::AngleBracketed(args) = &path.path.segments.last()?.arguments else {
        return None;
    };
    let mut types = args.args.iter().filter_map(|arg| match arg {
        GenericArgument::Type(ty) => Some(ty),
        _ => None,
    });
    match (types.next(), types.next(), types.next()) {
        (Some(_), Some(error), None) => Some(error),
        _ => None,
    }
}

/// A duration argument as an expression of type `Duration`: a literal as milliseconds, an
/// expression as written (spanned there, so a type that is not a `Duration` is reported on it).
fn duration(private: &TokenStream, millis: &Millis) -> TokenStream {
    match millis {
        Millis::Literal(ms) => quote!(#private::Duration::from_millis(#ms)),
        Millis::Expr(expr) => {
            let check = respan(quote!(#private::duration), expr.span());
            quote_spanned!(expr.span()=> #check(#expr))
        }
    }
}

/// The `format!` string and arguments that render the key template.
fn key_format(key: &[KeyPart]) -> (String, Vec<TokenStream>) {
    let mut format = String::new();
    let mut args = Vec::new();
    for part in key {
        match part {
            KeyPart::Text(text) => format.push_str(&text.replace('{', "{{").replace('}', "}}")),
            KeyPart::Value { root, fields } => {
                format.push_str("{}");
                args.push(quote!(#root #(. #fields)*));
            }
        }
    }
    (format, args)
}

fn respan(tokens: TokenStream, span: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|mut tree| {
            if let TokenTree::Group(group) = &tree {
                let mut inner = proc_macro2::Group::new(group.delimiter(), respan(group.stream(), span));
                inner.set_span(span);
                return TokenTree::Group(inner);
            }
            tree.set_span(span);
            tree
        })
        .collect()
}

fn has_impl_trait(ty: &Type) -> bool {
    struct Finder(bool);
    impl<'ast> Visit<'ast> for Finder {
        fn visit_type_impl_trait(&mut self, _: &'ast syn::TypeImplTrait) {
            self.0 = true;
        }
    }
    let mut finder = Finder(false);
    finder.visit_type(ty);
    finder.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expanded(args: TokenStream, item: TokenStream) -> String {
        distributed_lock(args, item).to_string()
    }

    #[test]
    fn read_and_write_set_the_mode() {
        let item = quote!(
            async fn f(id: u8) -> Result<(), E> {
                Ok(())
            }
        );
        let read = expanded(quote!(key = "k:<id>", read), item.clone());
        assert!(
            read.contains(". mode (:: lock_runtime :: __private :: LockMode :: Shared)"),
            "{read}"
        );
        let write = expanded(quote!(key = "k:<id>", write), item.clone());
        assert!(
            write.contains(". mode (:: lock_runtime :: __private :: LockMode :: Exclusive)"),
            "{write}"
        );
        let neither = expanded(quote!(key = "k:<id>"), item);
        assert!(!neither.contains("mode"), "{neither}");
    }

    #[test]
    fn a_boxed_future_is_guarded_inside_its_async_block() {
        let item = quote!(
            fn pay<'life0, 'async_trait>(
                self: Arc<Self>,
                id: u64,
            ) -> Pin<Box<dyn Future<Output = Result<String, Status>> + Send + 'async_trait>> {
                Box::pin(async move {
                    let __self = self;
                    let id = id;
                    let __ret: Result<String, Status> = { Ok(__self.name(id)) };
                    __ret
                })
            }
        );
        let out = expanded(quote!(key = "o:<self.shop>:<id>", client = self.locks), item);
        // The signature is kept; `self` of the attribute is async_trait's `__self`; the body runs
        // inside `run`, where `__ret` gets its value.
        assert!(out.starts_with("fn pay"), "{out}");
        assert!(out.contains("__self . shop , id"), "{out}");
        assert!(out.contains("lock_client (& (__self . locks))"), "{out}");
        let ret = out.find("let __ret").unwrap_or(usize::MAX);
        let run = out.find(":: run (").unwrap_or(0);
        assert!(ret < run, "{out}");
    }
}
