//! Every misuse of `#[distributed_lock]` the compiler can catch, each with its message and its
//! span pinned in `ui/<case>.stderr` (regenerate with `TRYBUILD=overwrite` and review the diff).

#[test]
fn attribute_misuse_is_a_compile_error_at_the_offending_token() {
    trybuild::TestCases::new().compile_fail("ui/*.rs");
}
