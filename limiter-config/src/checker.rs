//! The [`Checker`]: collects every problem of a walk over a parsed file, and reads typed
//! values (by hand, or by a schema row) reporting each wrong one where it is.

use std::{
    ops::Range,
    path::{Path, PathBuf},
};

use toml::{
    de::{DeArray, DeTable, DeValue},
    Spanned,
};

use crate::{
    problem::{LineIndex, MAX_PROBLEMS},
    schema::{Absent, Key, Kind, Section},
    ConfigError, ConfigWord, Problem,
};

/// A value of the parsed file, with its span.
pub type Value<'i> = Spanned<DeValue<'i>>;

/// Where a problem is and what it belongs to: the field's dotted path and the name of
/// the entry (rule, quota) it is part of.
#[derive(Debug, Clone, Copy)]
pub struct At<'a> {
    pub path: &'a str,
    pub rule: Option<&'a str>,
}

impl<'a> At<'a> {
    /// A field of no named entry.
    pub const fn top(path: &'a str) -> At<'a> {
        At { path, rule: None }
    }

    /// Another field of the same entry.
    pub fn field(&self, path: &'a str) -> At<'a> {
        At {
            path,
            rule: self.rule,
        }
    }
}

/// A problem before its position is worked out (at the end, in one pass over the text).
struct Pending {
    offset: usize,
    field: String,
    rule: Option<String>,
    message: String,
}

/// Collects the problems of one file.
pub struct Checker<'t> {
    text: &'t str,
    lines: LineIndex,
    problems: Vec<Pending>,
    /// Problems beyond [`MAX_PROBLEMS`]: counted, not kept.
    more: usize,
}

impl<'t> Checker<'t> {
    pub fn new(text: &'t str) -> Checker<'t> {
        Checker {
            text,
            lines: LineIndex::new(text),
            problems: Vec::new(),
            more: 0,
        }
    }

    /// Parses `text` as TOML; a syntax error names its line and column.
    pub fn parse<'i>(text: &'i str, origin: &Path) -> Result<Spanned<DeTable<'i>>, ConfigError> {
        DeTable::parse(text).map_err(|err| ConfigError::syntax(text, origin, &err))
    }

    /// Problems reported so far (kept or only counted).
    pub fn count(&self) -> usize {
        self.problems.len() + self.more
    }

    /// 1-based line of byte `offset`, for messages that point at another place.
    pub fn line(&self, offset: usize) -> usize {
        self.lines.line(offset)
    }

    /// Records a problem with the field at `at`, positioned at the start of `span`.
    pub fn report(&mut self, span: Range<usize>, at: At<'_>, message: impl Into<String>) {
        if self.problems.len() >= MAX_PROBLEMS {
            self.more += 1;
            return;
        }
        self.problems.push(Pending {
            offset: span.start,
            field: at.path.to_string(),
            rule: at.rule.map(str::to_string),
            message: message.into(),
        });
    }

    /// `Ok` when nothing was reported; else every problem, sorted by position.
    pub fn finish(self, origin: &Path) -> Result<(), ConfigError> {
        if self.problems.is_empty() && self.more == 0 {
            return Ok(());
        }
        let mut pending = self.problems;
        pending.sort_by_key(|p| p.offset);
        // One walk over the text for every position: a file of many problems on one
        // long line costs the line once, not once a problem.
        let (mut at, mut line, mut column) = (0usize, 1usize, 1usize);
        let mut problems = Vec::with_capacity(pending.len());
        for p in pending {
            let target = p.offset.min(self.text.len());
            if let Some(between) = self.text.get(at..target) {
                for c in between.chars() {
                    if c == '\n' {
                        line += 1;
                        column = 1;
                    } else {
                        column += 1;
                    }
                }
                at = target;
            } else if target != at {
                // Not on a character boundary (never for a parser's span).
                (line, column) = self.lines.position(self.text, target);
            }
            problems.push(Problem {
                line,
                column,
                field: p.field,
                rule: p.rule,
                message: p.message,
            });
        }
        Err(ConfigError::Invalid {
            path: origin.to_path_buf(),
            problems,
            more: self.more,
        })
    }

    /// Reports the keys of `table` that `section` does not list; `at.path` is the
    /// table's path (`""` at the top level).
    pub fn unknown_keys(&mut self, table: &DeTable<'_>, section: &Section, at: At<'_>) {
        for (key, _) in table.iter() {
            let name: &str = key.get_ref();
            if section.key(name).is_some() {
                continue;
            }
            let path = if at.path.is_empty() {
                name.to_string()
            } else {
                format!("{}.{name}", at.path)
            };
            let known: Vec<&str> = section.names().collect();
            self.report(
                key.span(),
                at.field(&path),
                format!(
                    "unknown key \"{name}\"; expected one of: {}",
                    known.join(", ")
                ),
            );
        }
    }

    /// The table `value` is; else a problem.
    pub fn table<'v, 'i>(&mut self, value: &'v Value<'i>, at: At<'_>) -> Option<&'v DeTable<'i>> {
        match value.get_ref() {
            DeValue::Table(table) => Some(table),
            other => {
                self.report(
                    value.span(),
                    at,
                    format!("expected a table, found {}", other.type_str()),
                );
                None
            }
        }
    }

    /// The items of the array `value` is; else a problem saying what the key takes
    /// (`expected`: "an array of interface names") and what it found.
    pub fn array<'v, 'i>(
        &mut self,
        value: &'v Value<'i>,
        at: At<'_>,
        expected: &str,
    ) -> Option<&'v DeArray<'i>> {
        match value.get_ref() {
            DeValue::Array(items) => Some(items),
            other => {
                self.report(
                    value.span(),
                    at,
                    format!("expected {expected}, found {}", other.type_str()),
                );
                None
            }
        }
    }

    /// [`Checker::array`], and a problem when it is empty: `name` is the key, `one` what
    /// one item is ("name at least one {one}").
    pub fn non_empty_array<'v, 'i>(
        &mut self,
        value: &'v Value<'i>,
        at: At<'_>,
        expected: &str,
        name: &str,
        one: &str,
    ) -> Option<&'v DeArray<'i>> {
        let items = self.array(value, at, expected)?;
        if items.is_empty() {
            self.report(
                value.span(),
                at,
                format!("{name} is an empty list: name at least one {one}"),
            );
            return None;
        }
        Some(items)
    }

    pub fn string<'v>(&mut self, value: &'v Value<'_>, at: At<'_>) -> Option<&'v str> {
        match value.get_ref() {
            DeValue::String(s) => Some(s.as_ref()),
            other => {
                self.report(
                    value.span(),
                    at,
                    format!("expected a string, found {}", other.type_str()),
                );
                None
            }
        }
    }

    /// An integer in `min..=max`.
    pub fn integer(&mut self, value: &Value<'_>, at: At<'_>, min: u64, max: u64) -> Option<u64> {
        let DeValue::Integer(int) = value.get_ref() else {
            self.report(
                value.span(),
                at,
                format!("expected an integer, found {}", value.get_ref().type_str()),
            );
            return None;
        };
        let parsed = i128::from_str_radix(int.as_str(), int.radix()).ok();
        match parsed {
            Some(n) if n >= i128::from(min) && n <= i128::from(max) => u64::try_from(n).ok(),
            _ => {
                let shown = parsed.map_or_else(|| int.to_string(), |n| n.to_string());
                let range = if max == u64::MAX {
                    format!("at least {min}")
                } else {
                    format!("between {min} and {max}")
                };
                self.report(value.span(), at, format!("must be {range}, got {shown}"));
                None
            }
        }
    }

    pub fn enumeration<E: ConfigWord>(&mut self, value: &Value<'_>, at: At<'_>) -> Option<E> {
        let s = self.string(value, at)?;
        match E::from_spelling(s) {
            Ok(v) => Some(v),
            Err(message) => {
                self.report(value.span(), at, message);
                None
            }
        }
    }

    /// A non-empty path.
    pub fn path(&mut self, value: &Value<'_>, at: At<'_>) -> Option<PathBuf> {
        let s = self.string(value, at)?;
        if s.is_empty() {
            self.report(value.span(), at, "must not be empty");
            return None;
        }
        Some(PathBuf::from(s))
    }

    /// A schema row the code reads in a way the row does not describe: a bug of the
    /// program, reported like a problem (never a panic) so a test finds it.
    pub(crate) fn schema_bug(&mut self, key: &Key, at: At<'_>, what: &str) {
        self.report(
            0..0,
            at,
            format!("internal: the schema row of {} {what}", key.name),
        );
    }

    /// `key` (a [`Kind::Integer`] row) in `table`: its value checked against the row's
    /// bounds, or the row's default when absent. `None` when the value is wrong
    /// (reported) or absent without a default.
    pub fn integer_key(&mut self, table: &DeTable<'_>, key: &Key, at: At<'_>) -> Option<u64> {
        let Kind::Integer { min, max } = key.kind else {
            self.schema_bug(key, at, "is not an integer");
            return None;
        };
        match table.get(key.name) {
            Some(value) => self.integer(value, at, min, max),
            None => match key.absent {
                Absent::Int(n) => Some(n),
                Absent::Str(_) => {
                    self.schema_bug(key, at, "has a string default");
                    None
                }
                Absent::Required | Absent::Unset(_) => None,
            },
        }
    }

    /// `key` (a [`Kind::Word`] row) in `table`, or the row's default spelling.
    pub fn word_key<E: ConfigWord>(
        &mut self,
        table: &DeTable<'_>,
        key: &Key,
        at: At<'_>,
    ) -> Option<E> {
        match table.get(key.name) {
            Some(value) => self.enumeration(value, at),
            None => {
                let Absent::Str(spelling) = key.absent else {
                    return None;
                };
                match E::from_spelling(spelling) {
                    Ok(v) => Some(v),
                    Err(_) => {
                        self.schema_bug(key, at, "has a default that is not a spelling");
                        None
                    }
                }
            }
        }
    }

    /// `key` (a [`Kind::Path`] row) in `table`, or the row's default path.
    pub fn path_key(&mut self, table: &DeTable<'_>, key: &Key, at: At<'_>) -> Option<PathBuf> {
        match table.get(key.name) {
            Some(value) => self.path(value, at),
            None => match key.absent {
                Absent::Str(path) => Some(PathBuf::from(path)),
                _ => None,
            },
        }
    }

    /// `key` (a string row) in `table`, or the row's default string.
    pub fn string_key<'v>(
        &mut self,
        table: &'v DeTable<'_>,
        key: &Key,
        at: At<'_>,
    ) -> Option<&'v str> {
        match table.get(key.name) {
            Some(value) => self.string(value, at),
            None => match key.absent {
                Absent::Str(s) => Some(s),
                _ => None,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use super::*;
    use crate::schema::{Absent, Kind};

    crate::section! {
        SECTION = "", crate::Applies::Restart {
            COUNT = "count", Absent::Int(7), Kind::Integer { min: 1, max: 10 }, "a count";
            LABEL = "label", Absent::Str("x"), Kind::String, "a label";
        }
    }

    fn problems(text: &str, walk: impl FnOnce(&mut Checker<'_>, &DeTable<'_>)) -> ConfigError {
        let root = Checker::parse(text, Path::new("t.toml")).unwrap();
        let mut checker = Checker::new(text);
        walk(&mut checker, root.get_ref());
        checker.finish(Path::new("t.toml")).unwrap_err()
    }

    #[test]
    fn every_problem_by_line_column_and_field_sorted_by_position() {
        let text = "label = 3\ncount = 11\n  other = \"é\"\n";
        let err = problems(text, |c, root| {
            c.integer_key(root, &COUNT, At::top("count"));
            c.string_key(root, &LABEL, At::top("label"));
            c.unknown_keys(root, &SECTION, At::top(""));
        });
        assert_eq!(
            err.to_string(),
            "t.toml:1:9: label: expected a string, found integer\n\
             t.toml:2:9: count: must be between 1 and 10, got 11\n\
             t.toml:3:3: other: unknown key \"other\"; expected one of: count, label"
        );
    }

    #[test]
    fn absent_keys_take_the_rows_default() {
        let root = Checker::parse("", Path::new("t.toml")).unwrap();
        let mut c = Checker::new("");
        assert_eq!(
            c.integer_key(root.get_ref(), &COUNT, At::top("count")),
            Some(7)
        );
        assert_eq!(
            c.string_key(root.get_ref(), &LABEL, At::top("label")),
            Some("x")
        );
        // A row read as what it is not is a problem, not a panic.
        assert_eq!(
            c.integer_key(root.get_ref(), &LABEL, At::top("label")),
            None
        );
        assert_eq!(c.count(), 1);
    }

    /// Thousands of problems: the first MAX_PROBLEMS in full, the rest counted, and
    /// every position right although they share one long line.
    #[test]
    fn many_problems_are_capped_and_positioned_in_one_pass() {
        let n = 10_000;
        let text = format!("count = [{}]\n", vec!["\"a\""; n].join(", "));
        let root = Checker::parse(&text, Path::new("t.toml")).unwrap();
        let mut c = Checker::new(&text);
        let DeValue::Array(items) = root.get_ref().get("count").unwrap().get_ref() else {
            panic!("not an array");
        };
        for item in items.iter() {
            c.integer(item, At::top("count"), 0, 1);
        }
        assert_eq!(c.count(), n);
        let err = c.finish(Path::new("t.toml")).unwrap_err();
        let shown = err.problems();
        assert_eq!(shown.len(), MAX_PROBLEMS);
        for (i, p) in shown.iter().enumerate() {
            // `count = [` is 9 characters; each item `"a", ` 5.
            assert_eq!((p.line, p.column), (1, 10 + 5 * i), "{p}");
        }
        let last = err.to_string().lines().last().unwrap().to_string();
        assert_eq!(
            last,
            format!(
                "t.toml: {} more problems not shown (the first {MAX_PROBLEMS} are above)",
                n - MAX_PROBLEMS
            )
        );
    }

    #[test]
    fn syntax_errors_have_line_and_column() {
        let err = Checker::parse("a = 1\nb = = 2\n", Path::new("t.toml")).unwrap_err();
        let ConfigError::Syntax { line, column, .. } = &err else {
            panic!("{err:?}");
        };
        assert_eq!((*line, *column), (Some(2), Some(5)), "{err}");
        assert!(err.to_string().starts_with("t.toml:2:5: "), "{err}");
    }
}
