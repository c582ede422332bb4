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
    // Credentials are what comes before the last '@' (a password may hold a raw '/', '?' or
    // '#': hiding too much is better than showing one); without one, the authority ends at the
    // first '/', '?' or '#'.
    let (authority, tail) = match rest.rfind('@') {
        Some(at) => {
            let end = rest[at..].find(['/', '?', '#']).map_or(rest.len(), |i| at + i);
            let host = &rest[at..end];
            if host.contains(['=', '&']) {
                // The '@' was inside the query (`?user=a@b&pass=…`): show none of it.
                return format!("{scheme}{HIDDEN}");
            }
            (format!("{HIDDEN}{host}"), &rest[end..])
        }
        None => {
            let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
            (rest[..end].to_owned(), &rest[end..])
        }
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
            ("redis://u:p@ss@host/2", "redis://<credentials>@host/2"),
            (
                "redis://:p#ss/secret@host:6379",
                "redis://<credentials>@host:6379",
            ),
            (
                "redis+unix:///run/redis.sock?user=a@b&pass=secret",
                "redis+unix://<credentials>",
            ),
        ] {
            assert_eq!(hide_credentials(url), shown, "{url}");
            assert!(!hide_credentials(url).contains("secret"), "{url}");
        }
    }
}
