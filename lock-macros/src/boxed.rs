//! Methods of `#[async_trait]` impls (tonic services, …). `#[async_trait]` sits on the impl, so
//! it expands before the attributes of the methods inside it: `#[distributed_lock]` on such a
//! method never sees an `async fn`, but what async_trait made of it:
//!
//! ```text
//! fn pay<'life0, 'async_trait>(&'life0 self, id: u64)
//!     -> Pin<Box<dyn Future<Output = Result<String, Status>> + Send + 'async_trait>>
//! where 'life0: 'async_trait, Self: 'async_trait
//! {
//!     Box::pin(async move {
//!         if let Some(__ret) = None::<Result<String, Status>> { return __ret; }
//!         let __self = self;       // the body names `self` as `__self` from here on
//!         let id = id;             // parameters (and names bound in patterns) rebound
//!         let __ret: Result<String, Status> = { /* the method's body */ };
//!         __ret
//!     })
//! }
//! ```
//!
//! This module recognises that shape: a fn returning `Pin<Box<dyn Future<Output = R> …>>` whose
//! body is `Box::pin(async move { … })`. The block to guard is the body in `let __ret: R = { … }`
//! when there is one (every parameter is bound there as the user wrote it), else the whole
//! `async move` block (the same shape written by hand).

use proc_macro2::{Group, Ident, TokenStream, TokenTree};
use quote::ToTokens;
use syn::{Block, Expr, GenericArgument, Pat, PathArguments, ReturnType, Stmt, Type, TypeParamBound};

/// The part of a boxed-future fn that the lock guards.
pub(crate) struct BoxedBody<'a> {
    /// The block to guard.
    pub(crate) block: &'a mut Block,
    /// async_trait moved `self` into `__self` before the body: the attribute's expressions that
    /// name `self` must name `__self` there (see [`rename_self`]).
    pub(crate) self_renamed: bool,
    /// The patterns async_trait binds before the body (`let id = id;`, `let Path(id) = __arg1;`):
    /// the names a key may use, next to those of the signature, which async_trait renamed when
    /// they were patterns.
    pub(crate) rebound: Vec<Pat>,
}

/// `R` of a return type `Pin<Box<dyn Future<Output = R> + …>>`.
pub(crate) fn future_output(ret: &ReturnType) -> Option<&Type> {
    let ReturnType::Type(_, ty) = ret else {
        return None;
    };
    let boxed = single_type_arg(ty, "Pin")?;
    let Type::TraitObject(object) = single_type_arg(boxed, "Box")? else {
        return None;
    };
    object.bounds.iter().find_map(|bound| {
        let TypeParamBound::Trait(bound) = bound else {
            return None;
        };
        let future = bound.path.segments.last()?;
        let PathArguments::AngleBracketed(args) = &future.arguments else {
            return None;
        };
        if future.ident != "Future" {
            return None;
        }
        args.args.iter().find_map(|arg| match arg {
            GenericArgument::AssocType(assoc) if assoc.ident == "Output" => Some(&assoc.ty),
            _ => None,
        })
    })
}

/// `T` of `Name<T>` (any path ending in `Name`).
fn single_type_arg<'a>(ty: &'a Type, name: &str) -> Option<&'a Type> {
    let Type::Path(path) = ty else {
        return None;
    };
    let last = path.path.segments.last()?;
    let PathArguments::AngleBracketed(args) = &last.arguments else {
        return None;
    };
    match (last.ident == name, args.args.first(), args.args.len()) {
        (true, Some(GenericArgument::Type(inner)), 1) => Some(inner),
        _ => None,
    }
}

/// The block to guard in a fn body that is `Box::pin(async move { … })`.
pub(crate) fn body_mut(block: &mut Block) -> Option<BoxedBody<'_>> {
    let [Stmt::Expr(Expr::Call(call), None)] = block.stmts.as_mut_slice() else {
        return None;
    };
    if !is_box_pin(&call.func) || call.args.len() != 1 {
        return None;
    }
    let Some(Expr::Async(async_block)) = call.args.first_mut() else {
        return None;
    };
    async_block.capture?; // `async move`: the parameters are moved in, as async_trait does
    if !has_let_ret(&async_block.block) {
        // No `let __ret` to guard: the whole block, which has not moved `self` yet.
        return Some(BoxedBody {
            block: &mut async_block.block,
            self_renamed: false,
            rebound: Vec::new(),
        });
    }
    let_ret_body(&mut async_block.block)
}

/// Whether async_trait's `let __ret: R = { … };` is in `block`, or in the `async move` block of
/// a `let` in it: `#[tracing::instrument]` above this attribute moves async_trait's block into
/// `let __tracing_instrument_future = async move { … };`, and guarding there puts the lock
/// inside the span, with the parameters bound as async_trait binds them.
fn has_let_ret(block: &Block) -> bool {
    block.stmts.iter().any(is_let_ret)
        || block
            .stmts
            .iter()
            .any(|stmt| inner_async(stmt).is_some_and(has_let_ret))
}

/// The `async move` block a `let` statement starts.
fn inner_async(stmt: &Stmt) -> Option<&Block> {
    let Stmt::Local(local) = stmt else {
        return None;
    };
    match local.init.as_ref().map(|init| &*init.expr) {
        Some(Expr::Async(inner)) if inner.capture.is_some() => Some(&inner.block),
        _ => None,
    }
}

/// The body in `let __ret: R = { … };` (see [`has_let_ret`]).
fn let_ret_body(block: &mut Block) -> Option<BoxedBody<'_>> {
    let Some(at) = block.stmts.iter().position(is_let_ret) else {
        let at = block
            .stmts
            .iter()
            .position(|stmt| inner_async(stmt).is_some_and(has_let_ret))?;
        let Stmt::Local(local) = &mut block.stmts[at] else {
            return None;
        };
        return match local.init.as_mut().map(|init| &mut *init.expr) {
            Some(Expr::Async(inner)) => let_ret_body(&mut inner.block),
            _ => None,
        };
    };
    let (before, rest) = block.stmts.split_at_mut(at);
    let rebound = before
        .iter()
        .filter_map(|stmt| match stmt {
            Stmt::Local(local) => Some(local.pat.clone()),
            _ => None,
        })
        .collect();
    let self_renamed = before.iter().any(rebinds_self);
    match rest.first_mut() {
        Some(Stmt::Local(local)) => match local.init.as_mut().map(|init| &mut *init.expr) {
            Some(Expr::Block(body)) => Some(BoxedBody {
                block: &mut body.block,
                self_renamed,
                rebound,
            }),
            _ => None,
        },
        _ => None,
    }
}

fn is_box_pin(func: &Expr) -> bool {
    let Expr::Path(path) = func else {
        return false;
    };
    let names: Vec<&Ident> = path.path.segments.iter().map(|s| &s.ident).collect();
    matches!(names.as_slice(), [.., boxed, pin] if *boxed == "Box" && *pin == "pin")
}

/// `let __ret: R = { … };` (async_trait's binding of the body's value).
fn is_let_ret(stmt: &Stmt) -> bool {
    let Stmt::Local(local) = stmt else {
        return false;
    };
    let Pat::Type(typed) = &local.pat else {
        return false;
    };
    matches!(&*typed.pat, Pat::Ident(p) if p.ident == "__ret")
        && matches!(local.init.as_ref().map(|init| &*init.expr), Some(Expr::Block(_)))
}

/// `let __self = self;` or `let mut __self = self;`.
fn rebinds_self(stmt: &Stmt) -> bool {
    let Stmt::Local(local) = stmt else {
        return false;
    };
    matches!(&local.pat, Pat::Ident(p) if p.ident == "__self")
        && matches!(
            local.init.as_ref().map(|init| &*init.expr),
            Some(Expr::Path(path)) if path.path.is_ident("self")
        )
}

/// Renames `self` to `__self` in an expression of the attribute (`client = self.locks`), as
/// async_trait does in the body; `self::item` paths are left alone.
pub(crate) fn rename_self(expr: &mut Expr) {
    fn rename(tokens: TokenStream) -> TokenStream {
        let mut out = Vec::new();
        let mut tokens = tokens.into_iter().peekable();
        while let Some(tree) = tokens.next() {
            out.push(match tree {
                TokenTree::Ident(ident) if ident == "self" => {
                    let path = matches!(tokens.peek(), Some(TokenTree::Punct(p)) if p.as_char() == ':');
                    if path {
                        TokenTree::Ident(ident)
                    } else {
                        TokenTree::Ident(Ident::new("__self", ident.span()))
                    }
                }
                TokenTree::Group(group) => {
                    let mut renamed = Group::new(group.delimiter(), rename(group.stream()));
                    renamed.set_span(group.span());
                    TokenTree::Group(renamed)
                }
                other => other,
            });
        }
        out.into_iter().collect()
    }
    if let Ok(renamed) = syn::parse2(rename(expr.to_token_stream())) {
        *expr = renamed;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use syn::ItemFn;

    /// What async-trait 0.1 makes of `async fn pay(&self, id: u64) -> Result<String, Status>`.
    fn async_trait_output() -> ItemFn {
        syn::parse_quote! {
            fn pay<'life0, 'async_trait>(&'life0 self, id: u64)
                -> ::core::pin::Pin<Box<dyn ::core::future::Future<Output = Result<String, Status>>
                    + ::core::marker::Send + 'async_trait>>
            where 'life0: 'async_trait, Self: 'async_trait
            {
                Box::pin(async move {
                    if let ::core::option::Option::Some(__ret) = ::core::option::Option::None::<Result<String, Status>> {
                        #[allow(unreachable_code)]
                        return __ret;
                    }
                    let __self = self;
                    let id = id;
                    let __ret: Result<String, Status> = { Ok(__self.name(id)) };
                    #[allow(unreachable_code)]
                    __ret
                })
            }
        }
    }

    #[test]
    fn finds_the_output_and_the_body_of_async_trait_output() {
        let mut item = async_trait_output();
        let output = future_output(&item.sig.output).map(|t| t.to_token_stream().to_string());
        assert_eq!(output.as_deref(), Some("Result < String , Status >"));
        let body = body_mut(&mut item.block).map(|b| (b.block.to_token_stream().to_string(), b.self_renamed));
        assert_eq!(body, Some(("{ Ok (__self . name (id)) }".to_owned(), true)));
    }

    #[test]
    fn finds_the_body_inside_tracing_instrument_output() {
        // What #[tracing::instrument] makes of async_trait's output before this attribute runs.
        let mut block: Block = syn::parse_quote!({
            ::std::boxed::Box::pin(async move {
                let __tracing_attr_span = span();
                let __tracing_instrument_future = async move {
                    let __self = self;
                    let (id, region) = {
                        let __arg1 = __arg1;
                        __arg1
                    };
                    let __ret: Result<String, Status> = { Ok(__self.name(id, region)) };
                    __ret
                };
                __tracing_instrument_future.await
            })
        });
        let body = body_mut(&mut block).map(|b| {
            let mut names = Vec::new();
            for pat in &b.rebound {
                names.push(pat.to_token_stream().to_string());
            }
            (b.block.to_token_stream().to_string(), b.self_renamed, names)
        });
        let expected = (
            "{ Ok (__self . name (id , region)) }".to_owned(),
            true,
            vec!["__self".to_owned(), "(id , region)".to_owned()],
        );
        assert_eq!(body, Some(expected));
    }

    #[test]
    fn takes_a_hand_written_boxed_future_whole() {
        let mut item: ItemFn = syn::parse_quote! {
            fn pay(&self) -> Pin<Box<dyn Future<Output = u8> + Send + '_>> {
                Box::pin(async move { let a = 1; a })
            }
        };
        assert!(future_output(&item.sig.output).is_some());
        let body = body_mut(&mut item.block).map(|b| (b.block.stmts.len(), b.self_renamed));
        assert_eq!(body, Some((2, false)));
    }

    #[test]
    fn rejects_other_shapes() {
        for ret in [
            quote::quote!(-> u8),
            quote::quote!(-> Box<dyn Future<Output = u8>>),
            quote::quote!(-> Pin<Box<dyn Iterator<Item = u8>>>),
        ] {
            let ret: ReturnType = syn::parse2(ret).unwrap_or(ReturnType::Default);
            assert!(future_output(&ret).is_none());
        }
        for body in [
            quote::quote!({ Box::pin(async { 1 }) }),
            quote::quote!({ Box::new(async move { 1 }) }),
            quote::quote!({
                let x = 1;
                Box::pin(async move { x })
            }),
        ] {
            let mut block: Block = syn::parse2(body).unwrap_or_else(|_| syn::parse_quote!({}));
            assert!(body_mut(&mut block).is_none());
        }
    }

    #[test]
    fn renames_self_but_not_self_paths() {
        let mut expr: Expr = syn::parse_quote!(pick(&self.locks, self::DEFAULT, Self::X));
        rename_self(&mut expr);
        assert_eq!(
            expr.to_token_stream().to_string(),
            "pick (& __self . locks , self :: DEFAULT , Self :: X)"
        );
    }
}
