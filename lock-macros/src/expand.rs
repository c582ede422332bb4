//! Writes the guarded fn. The signature stays as written (an `async fn`, with its attributes);
//! the body becomes:
//!
//! ```text
//! let key = format!(<template>, <placeholders>);   // before the body owns the arguments
//! let client = Some(ClientRef::lock_client(&(<client expr>)));   // or None: the default client
//! let options = LockOptions::new(..)...;   // or IntoLockOptions::into_lock_options(<options expr>)
//! match __private::run(client, key, options, async move { <body> }).await {
//!     Ok(out) => out,                       // the body's own return value, whatever it was
//!     Err(e) => __private::lock_failed(e),  // Err(E::from(LockError))
//! }
//! ```
//!
//! `return` and `?` in the body land in the inner `async move` block, so every exit of the body
//! comes back through `run`, which releases the lock before the fn returns; a panic or a dropped
//! future releases through the guard's `Drop`. Generated names use `Span::mixed_site()`, so user
//! code can neither see nor shadow them.

use proc_macro2::{Ident, Span, TokenStream, TokenTree};
use quote::{quote, quote_spanned, ToTokens};
use syn::spanned::Spanned;
use syn::visit::Visit;
use syn::{ItemFn, ReturnType, Type};

use crate::parse::RawArgs;
use crate::validate::{validate, Config, KeyPart, Millis, OnLost};

/// The attribute's entry point. On any error, the item is emitted unchanged next to the errors,
/// so the rest of the crate still type-checks and IDEs keep working.
pub(crate) fn distributed_lock(args: TokenStream, item: TokenStream) -> TokenStream {
    let parsed = syn::parse2::<ItemFn>(item.clone()).and_then(|item_fn| {
        let args = syn::parse2::<RawArgs>(args)?;
        let config = validate(args, &item_fn)?;
        Ok(expand(config, item_fn))
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

fn expand(config: Config, mut item: ItemFn) -> TokenStream {
    let krate = &config.krate;
    let private = quote!(#krate::__private);
    let (format, placeholders) = key_format(&config);
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
            quote! {
                #private::LockOptions::new(#ttl)
                    .watchdog(#watchdog)
                    .wait(#wait)
                    .fencing(#fencing)
                    .fair(#fair)
                    .hold_at_least(#hold)
                    .on_lost(#on_lost)
            }
        }
    };

    // A failed lock becomes the fn's error through `E: From<LockError>`; the check is spanned on
    // the return type so a wrong one is reported there.
    let ret_span = match &item.sig.output {
        ReturnType::Type(_, ty) => ty.span(),
        ReturnType::Default => item.sig.ident.span(),
    };
    let lock_failed = respan(quote!(#private::lock_failed), ret_span);
    let failed = quote_spanned!(ret_span=> #lock_failed(#err));

    // Fixes the inner block's type to the fn's return type up front, so `?` and `return` in the
    // body infer as they would without the attribute (the trick tracing-attributes uses).
    let anchor = match &item.sig.output {
        ReturnType::Type(_, ty) if !has_impl_trait(ty) => {
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

    // The body's statements, not its block: pasted with its braces as the tail of another block,
    // a one-line body would trip `unused_braces` in the user's crate.
    let stmts = &item.block.stmts;
    let body = quote! {{
        let #key = ::std::format!(#format #(, #placeholders)*);
        let #client = #client_expr;
        let #options = #options_expr;
        match #private::run(#client, #key, #options, async move { #anchor #(#stmts)* }).await {
            ::core::result::Result::Ok(#out) => #out,
            ::core::result::Result::Err(#err) => #failed,
        }
    }};
    item.block = Box::new(syn::parse_quote!(#body));
    item.into_token_stream()
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
fn key_format(config: &Config) -> (String, Vec<TokenStream>) {
    let mut format = String::new();
    let mut args = Vec::new();
    for part in &config.key {
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
