//! What a store's URL carries escaped: a user or a password written with `%XX` escapes. Its own
//! module, so that the stores parsing such URLs and the URL dispatch (which names the stores)
//! do not import each other.

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
