//! Reads `name`, `name = value` pairs as written; nothing is judged here but the syntax.

use proc_macro2::Ident;
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::{Expr, Token};

/// One argument as written: `watchdog` or `ttl_ms = 30000`.
pub(crate) struct RawArg {
    pub(crate) name: Ident,
    pub(crate) value: Option<Expr>,
}

impl Parse for RawArg {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        // `parse_any` also takes keywords, for `crate = "…"`.
        let name = Ident::parse_any(input)?;
        let value = if input.peek(Token![=]) {
            input.parse::<Token![=]>()?;
            Some(input.parse()?)
        } else {
            None
        };
        Ok(RawArg { name, value })
    }
}

/// All the arguments of one attribute.
pub(crate) struct RawArgs(pub(crate) Vec<RawArg>);

impl Parse for RawArgs {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let args = Punctuated::<RawArg, Token![,]>::parse_terminated(input)?;
        Ok(RawArgs(args.into_iter().collect()))
    }
}
