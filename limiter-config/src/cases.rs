//! Config error cases as table rows, for the tests of every binary that reads a config:
//! one bad input a row and the one problem it must be told. A case fails when the input
//! is accepted, when it has more than that one problem, or when the problem is on another
//! field, rule, position or says something else; [`run`] names every failing row.

use crate::ConfigError;

/// One bad input and what it is told.
///
/// Where `text` holds a `^`, the problem must be at that position (the `^` is removed
/// before parsing); without one, any position will do.
#[derive(Debug, Clone)]
pub struct ErrorCase {
    pub name: String,
    pub text: String,
    /// The dotted field path the problem is on.
    pub field: String,
    /// The named entry (rule, quota) the field belongs to.
    pub rule: Option<String>,
    /// A part of the message.
    pub message: String,
}

impl ErrorCase {
    pub fn new(name: &str, text: &str, field: &str, message: &str) -> ErrorCase {
        ErrorCase {
            name: name.to_string(),
            text: text.to_string(),
            field: field.to_string(),
            rule: None,
            message: message.to_string(),
        }
    }

    /// The case's field belongs to the entry named `rule`.
    pub fn of(self, rule: &str) -> ErrorCase {
        ErrorCase {
            rule: Some(rule.to_string()),
            ..self
        }
    }

    /// Parses the case's text with `parse` (which names the file `origin`) and says what
    /// is wrong with the outcome, if anything.
    pub fn check<T>(
        &self,
        origin: &str,
        parse: impl Fn(&str) -> Result<T, ConfigError>,
    ) -> Result<(), String> {
        let (text, at) = match self.text.find('^') {
            Some(marker) => {
                let text = self.text.replacen('^', "", 1);
                let at = position(&text, marker);
                (text, Some(at))
            }
            None => (self.text.clone(), None),
        };
        let err = match parse(&text) {
            Ok(_) => return Err(format!("accepted:\n{text}")),
            Err(err) => err,
        };
        let rendered = err.to_string();
        let [problem] = err.problems() else {
            return Err(format!("expected one problem, got:\n{rendered}"));
        };
        let mut head = match at {
            Some((line, column)) => format!("{origin}:{line}:{column}: {}", self.field),
            None => format!(
                "{origin}:{}:{}: {}",
                problem.line, problem.column, self.field
            ),
        };
        if let Some(rule) = &self.rule {
            head.push_str(&format!(" ({rule:?})"));
        }
        head.push_str(": ");
        if rendered.starts_with(&head) && rendered.contains(&self.message) {
            Ok(())
        } else {
            Err(format!(
                "expected {head:?} and {:?}, got:\n{rendered}",
                self.message
            ))
        }
    }
}

/// Checks every case; panics naming each failing one and what it got.
pub fn run<T>(cases: &[ErrorCase], origin: &str, parse: impl Fn(&str) -> Result<T, ConfigError>) {
    let failed: Vec<String> = cases
        .iter()
        .filter_map(|case| {
            case.check(origin, &parse)
                .err()
                .map(|why| format!("{}: {why}", case.name))
        })
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {} cases failed:\n{}",
        failed.len(),
        cases.len(),
        failed.join("\n")
    );
}

/// (line, column), 1-based, of byte `offset` of `text`.
fn position(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset];
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    (
        before.matches('\n').count() + 1,
        before[line_start..].chars().count() + 1,
    )
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::{At, Checker};

    /// A parser with one problem: the key `bad`, wherever it is.
    fn parse(text: &str) -> Result<(), ConfigError> {
        let root = Checker::parse(text, Path::new("t.toml"))?;
        let mut checker = Checker::new(text);
        if let Some(value) = root.get_ref().get("bad") {
            checker.report(value.span(), At::top("bad"), "is bad");
        }
        checker.finish(Path::new("t.toml"))
    }

    #[test]
    fn a_case_fails_on_each_way_of_being_wrong() {
        let ok = ErrorCase::new("ok", "x = 1\nbad = ^2\n", "bad", "is bad");
        assert_eq!(ok.check("t.toml", parse), Ok(()));
        let unmarked = ErrorCase::new("unmarked", "bad = 2\n", "bad", "is bad");
        assert_eq!(unmarked.check("t.toml", parse), Ok(()));
        let wrong = [
            ErrorCase::new("accepted", "x = ^1\n", "bad", "is bad"),
            ErrorCase::new("elsewhere", "^x = 1\nbad = 2\n", "bad", "is bad"),
            ErrorCase::new("other field", "bad = ^2\n", "good", "is bad"),
            ErrorCase::new("other message", "bad = ^2\n", "bad", "is good"),
            ErrorCase::new("other rule", "bad = ^2\n", "bad", "is bad").of("web"),
        ];
        for case in &wrong {
            assert!(case.check("t.toml", parse).is_err(), "{}", case.name);
        }
    }
}
