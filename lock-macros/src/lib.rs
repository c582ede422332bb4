//! The `#[distributed_lock]` attribute of `lock-runtime`. Use it through `lock_runtime`.

use proc_macro::TokenStream;

/// Guards an async fn with a distributed lock. See `lock_runtime::distributed_lock`.
#[proc_macro_attribute]
pub fn distributed_lock(args: TokenStream, item: TokenStream) -> TokenStream {
    let _ = args;
    item
}
