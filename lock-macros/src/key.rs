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
    fn rejects_bad_placeholders() {
        for bad in ["a<", "a<b", "<>", "< >", "<a<b>", "<a-b>", "<0>", "<a..b>"] {
            assert!(parse_template(bad).is_err(), "{bad}");
        }
    }
}
