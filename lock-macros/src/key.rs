//! Key templates: `"order:<id>"`, `"tenant:<req.tenant.id>:job"`.

/// One piece of a key template.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Piece {
    Text(String),
    /// `<a.b.c>`: a parameter name, then field names or tuple indexes.
    Placeholder(Vec<String>),
}

/// Splits a template into text and placeholders; the error says what is wrong, for a span on
/// the literal.
pub(crate) fn parse_template(template: &str) -> Result<Vec<Piece>, String> {
    let mut pieces = Vec::new();
    let mut rest = template;
    while let Some(open) = rest.find('<') {
        if open > 0 {
            pieces.push(Piece::Text(rest[..open].to_owned()));
        }
        let after = &rest[open + 1..];
        let Some(close) = after.find('>') else {
            return Err(format!(
                "unclosed `<` in key template `{template}`: write `<name>`"
            ));
        };
        let inner = &after[..close];
        if inner.trim().is_empty() {
            return Err(format!(
                "empty placeholder `<>` in key template `{template}`: name a parameter, as in `<id>`"
            ));
        }
        if inner.contains('<') {
            return Err(format!(
                "unclosed `<` in key template `{template}`: write `<name>`"
            ));
        }
        let path: Vec<String> = inner.split('.').map(|s| s.trim().to_owned()).collect();
        if let Some(bad) = path.iter().find(|s| !is_segment(s)) {
            return Err(format!(
                "`<{inner}>` in key template is not a parameter path (`{bad}` is not a name or a tuple index)"
            ));
        }
        if path[0].chars().all(|c| c.is_ascii_digit()) {
            return Err(format!(
                "`<{inner}>` in key template must start with a parameter name"
            ));
        }
        pieces.push(Piece::Placeholder(path));
        rest = &after[close + 1..];
    }
    if !rest.is_empty() {
        pieces.push(Piece::Text(rest.to_owned()));
    }
    Ok(pieces)
}

/// A `{…}` group in a template's literal text that reads like a `format!` placeholder: what it
/// would name (`id`, `order.id`, `self.id`), without any format spec (`{id:?}`). Braces around
/// anything else (`{"a":1}`, `{}`, `{0}`) are not listed: they stay literal text.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Braced {
    /// As written between the braces, e.g. `id:?`.
    pub(crate) written: String,
    /// The path it names, e.g. `["order", "id"]`.
    pub(crate) path: Vec<String>,
}

/// The `{name}` groups in a piece of literal text (see [`Braced`]).
pub(crate) fn braced(text: &str) -> Vec<Braced> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find('{') {
        let after = &rest[open + 1..];
        let Some(close) = after.find('}') else {
            break;
        };
        // The innermost group: `{{id}}` reads as `{id}`.
        let written = after[..close].rsplit('{').next().unwrap_or_default();
        let named = written.split(':').next().unwrap_or_default().trim();
        let path: Vec<String> = named.split('.').map(|s| s.trim().to_owned()).collect();
        let starts_with_name = path[0].chars().next().is_some_and(|c| !c.is_ascii_digit());
        if starts_with_name && path.iter().all(|s| is_segment(s)) {
            out.push(Braced {
                written: written.to_owned(),
                path,
            });
        }
        rest = &after[close + 1..];
    }
    out
}

fn is_segment(s: &str) -> bool {
    let mut chars = s.chars();
    match chars.next() {
        Some(c) if c.is_ascii_digit() => s.chars().all(|c| c.is_ascii_digit()),
        Some(c) if c == '_' || c.is_alphabetic() => chars.all(|c| c == '_' || c.is_alphanumeric()),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(s: &str) -> Piece {
        Piece::Text(s.to_owned())
    }
    fn hole(path: &[&str]) -> Piece {
        Piece::Placeholder(path.iter().map(|s| (*s).to_owned()).collect())
    }

    #[test]
    fn splits_text_and_placeholders() {
        assert_eq!(
            parse_template("order:<id>"),
            Ok(vec![text("order:"), hole(&["id"])])
        );
        assert_eq!(
            parse_template("<a.b.0>-x-<c>"),
            Ok(vec![hole(&["a", "b", "0"]), text("-x-"), hole(&["c"])])
        );
        assert_eq!(
            parse_template("plain {braces} >"),
            Ok(vec![text("plain {braces} >")])
        );
    }

    #[test]
    fn finds_format_style_braces() {
        let found = |text: &str| -> Vec<Vec<String>> { braced(text).into_iter().map(|b| b.path).collect() };
        let path = |p: &[&str]| p.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(found("order:{id}"), vec![path(&["id"])]);
        assert_eq!(
            found("{ order.id }-{n:?}"),
            vec![path(&["order", "id"]), path(&["n"])]
        );
        assert_eq!(found("{{self.id}}"), vec![path(&["self", "id"])]);
        assert_eq!(braced("x{n:>4}")[0].written, "n:>4");
        for literal in ["{}", "{0}", r#"{"a":1}"#, "{a b}", "{a-b}", "{ ", "}{", "{:x}"] {
            assert_eq!(found(literal), Vec::<Vec<String>>::new(), "{literal}");
        }
    }

    #[test]
    fn rejects_bad_placeholders() {
        for bad in ["a<", "a<b", "<>", "< >", "<a<b>", "<a-b>", "<0>", "<a..b>"] {
            assert!(parse_template(bad).is_err(), "{bad}");
        }
    }
}
