//! The `#[distributed_lock]` attribute of `lock-runtime`. Depend on `lock-runtime` and use it as
//! `lock_runtime::distributed_lock`; the reference lives there.
//!
//! Structure (private modules): `parse` reads the attribute's arguments as written, `validate`
//! checks them against the fn and builds a `validate::Config`, `expand` writes the code.

#![warn(missing_docs)]

use proc_macro::TokenStream;

mod boxed;
mod expand;
mod key;
mod parse;
mod suggest;
mod validate;

/// Guards an async fn with a distributed lock: see `lock_runtime::distributed_lock` for the
/// reference.
#[proc_macro_attribute]
pub fn distributed_lock(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::distributed_lock(args.into(), item.into()).into()
}
