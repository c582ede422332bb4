//! What a store's URL carries escaped: a user or a password written with `%XX` escapes. Its own
//! module, so that the stores parsing such URLs and the URL dispatch (which names the stores)
//! do not import each other.

/// A URL authority's credentials and what follows them: `user:password@rest` gives the user
/// and password (`%XX` escapes decoded; a user alone has an empty password) and `rest`; without
/// an `@`, no credentials and the whole `authority`.
#[cfg_attr(not(any(feature = "etcd", feature = "zookeeper")), allow(dead_code))]
pub(crate) fn userinfo(authority: &str) -> (Option<(String, String)>, &str) {
    match authority.rsplit_once('@') {
        Some((userinfo, rest)) => {
            let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
            (Some((percent_decoded(user), percent_decoded(password))), rest)
        }
        None => (None, authority),
    }
}

/// `%XX` escapes decoded (a user or password in a URL: etcd's, ZooKeeper's).
#[cfg_attr(not(any(feature = "etcd", feature = "zookeeper")), allow(dead_code))]
pub(crate) fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        let hex = bytes
            .get(at + 1..at + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[at], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                at += 3;
            }
            (byte, _) => {
                out.push(byte);
                at += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_split_off_and_decoded() {
        assert_eq!(
            userinfo("us%40er:p%3Ass@a:1,b:2"),
            (Some(("us@er".to_owned(), "p:ss".to_owned())), "a:1,b:2")
        );
        assert_eq!(
            userinfo("user@a:1"),
            (Some(("user".to_owned(), String::new())), "a:1")
        );
        assert_eq!(userinfo("a:1"), (None, "a:1"));
        // The last `@` ends the credentials: a password may hold one unescaped.
        assert_eq!(
            userinfo("u:p@ss@h:1"),
            (Some(("u".to_owned(), "p@ss".to_owned())), "h:1")
        );
    }
}
