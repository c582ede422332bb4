//! URLs as they may be shown to people (a `Debug` of the builder, `lockctl`'s messages): with
//! every credential replaced by `<credentials>`, in every form redis-rs reads one. Shared by the
//! library and `lockctl` (which includes this file), so both hide the same things.

/// `url` with its user and password replaced by `<credentials>`: the user-info before the host
/// (`redis://user:pass@host`, `rediss://:pass@host`) and the `user`, `username`, `pass` and
/// `password` query parameters (`redis+unix:///run/redis.sock?pass=…`, `unix://…?user=…`).
pub(crate) fn hide_credentials(url: &str) -> String {
    const HIDDEN: &str = "<credentials>";
    let (scheme, rest) = match url.find("://") {
        Some(at) => url.split_at(at + 3),
        None => ("", url),
    };
    // The authority ends at the first '/', '?' or '#'; credentials are what comes before its
    // last '@'.
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let authority = match authority.rfind('@') {
        Some(at) => format!("{HIDDEN}{}", &authority[at..]),
        None => authority.to_owned(),
    };
    let (path, query_and_fragment) = match tail.find('?') {
        Some(at) => tail.split_at(at),
        None => (tail, ""),
    };
    let (query, fragment) = match query_and_fragment.find('#') {
        Some(at) => query_and_fragment.split_at(at),
        None => (query_and_fragment, ""),
    };
    let query = query
        .strip_prefix('?')
        .map(|params| {
            let hidden: Vec<String> = params
                .split('&')
                .map(|param| match param.split_once('=') {
                    Some((name, _))
                        if ["user", "username", "pass", "password"]
                            .contains(&name.to_ascii_lowercase().as_str()) =>
                    {
                        format!("{name}={HIDDEN}")
                    }
                    _ => param.to_owned(),
                })
                .collect();
            format!("?{}", hidden.join("&"))
        })
        .unwrap_or_default();
    format!("{scheme}{authority}{path}{query}{fragment}")
}

#[cfg(test)]
mod tests {
    use super::hide_credentials;

    #[test]
    fn credentials_are_hidden_in_every_url_form() {
        for (url, shown) in [
            (
                "redis://user:secret@host:6379/2",
                "redis://<credentials>@host:6379/2",
            ),
            ("rediss://:secret@host", "rediss://<credentials>@host"),
            ("redis://host:6379", "redis://host:6379"),
            (
                "redis+unix:///run/redis.sock?db=1&pass=secret",
                "redis+unix:///run/redis.sock?db=1&pass=<credentials>",
            ),
            (
                "unix:///run/redis.sock?user=me&password=secret",
                "unix:///run/redis.sock?user=<credentials>&password=<credentials>",
            ),
            ("redis://host/0?x=1#insecure", "redis://host/0?x=1#insecure"),
            ("redis://u:p@ss@host/path@x", "redis://<credentials>@host/path@x"),
        ] {
            assert_eq!(hide_credentials(url), shown, "{url}");
            assert!(!hide_credentials(url).contains("secret"), "{url}");
        }
    }
}
