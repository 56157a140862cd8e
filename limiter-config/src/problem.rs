//! What a rejected config is told: [`Problem`]s by line, column and field, and the
//! [`ConfigError`] that renders them one a line as `FILE:LINE:COLUMN: FIELD: MESSAGE`.

use std::{
    fmt,
    io::Read as _,
    path::{Path, PathBuf},
};

/// The largest config file read. A limiter config of 1024 rules is about 200 KiB; the cap
/// keeps a mistaken path (a log file, `/dev/zero`) from filling memory before the
/// checker could refuse it.
pub const MAX_CONFIG_BYTES: u64 = 16 << 20;

/// The most problems kept in full. A file of thousands of bad lines still gets its first
/// problems with their text and the count of the rest, and memory stays bounded
/// (16 MiB of `x = 1` lines would otherwise make millions of messages, each listing the
/// known keys).
pub const MAX_PROBLEMS: usize = 1000;

/// One thing wrong with a config file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// 1-based line in the file.
    pub line: usize,
    /// 1-based column, in characters (what an editor shows), of the key or value.
    pub column: usize,
    /// Dotted path of the field, e.g. `rules[1].per_source.burst`.
    pub field: String,
    /// Name of the entry the field belongs to (a rule, a quota), when known.
    pub rule: Option<String>,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.field)?;
        if let Some(rule) = &self.rule {
            write!(f, " ({rule:?})")?;
        }
        write!(f, ": {}", self.message)
    }
}

/// Why a config file was rejected. Its `Display` names the file, line and column of each
/// problem.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{}: cannot read config: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file is larger than [`MAX_CONFIG_BYTES`]; nothing of it was checked.
    #[error(
        "{}: the config is larger than {} MiB; is this the right file?",
        path.display(),
        MAX_CONFIG_BYTES >> 20
    )]
    TooLarge { path: PathBuf },
    /// The file is not UTF-8 text or not valid TOML; `message` is what is wrong.
    #[error("{}", syntax_display(path, *line, *column, message))]
    Syntax {
        path: PathBuf,
        /// 1-based line and column, when the position is known.
        line: Option<usize>,
        column: Option<usize>,
        message: String,
    },
    /// The file is TOML but breaks the config's rules; every problem found, by position
    /// (the first [`MAX_PROBLEMS`] in full, `more` counts the rest).
    #[error("{}", invalid_display(path, problems, *more))]
    Invalid {
        path: PathBuf,
        problems: Vec<Problem>,
        more: usize,
    },
}

impl ConfigError {
    /// The problems of an `Invalid` config (empty for the other kinds).
    pub fn problems(&self) -> &[Problem] {
        match self {
            ConfigError::Invalid { problems, .. } => problems,
            ConfigError::Read { .. }
            | ConfigError::TooLarge { .. }
            | ConfigError::Syntax { .. } => &[],
        }
    }

    /// The parser's error, with its position.
    pub fn syntax(text: &str, origin: &Path, err: &toml::de::Error) -> ConfigError {
        let position = err
            .span()
            .map(|span| LineIndex::new(text).position(text, span.start));
        ConfigError::Syntax {
            path: origin.to_path_buf(),
            line: position.map(|(line, _)| line),
            column: position.map(|(_, column)| column),
            message: err.to_string().trim_end().to_string(),
        }
    }
}

fn syntax_display(
    path: &Path,
    line: Option<usize>,
    column: Option<usize>,
    message: &str,
) -> String {
    match (line, column) {
        (Some(line), Some(column)) => format!("{}:{line}:{column}: {message}", path.display()),
        (Some(line), None) => format!("{}:{line}: {message}", path.display()),
        _ => format!("{}: {message}", path.display()),
    }
}

fn invalid_display(path: &Path, problems: &[Problem], more: usize) -> String {
    let mut lines: Vec<String> = problems
        .iter()
        .map(|p| format!("{}:{}:{}: {p}", path.display(), p.line, p.column))
        .collect();
    if more > 0 {
        lines.push(format!(
            "{}: {more} more problems not shown (the first {} are above)",
            path.display(),
            problems.len()
        ));
    }
    lines.join("\n")
}

/// Reads a config file as text: at most [`MAX_CONFIG_BYTES`], and UTF-8 (else the line
/// and column of the first byte that is not).
pub fn read_file(path: &Path) -> Result<String, ConfigError> {
    let read_error = |source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(read_error)?;
    let mut bytes = Vec::new();
    file.take(MAX_CONFIG_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(read_error)?;
    if bytes.len() as u64 > MAX_CONFIG_BYTES {
        return Err(ConfigError::TooLarge {
            path: path.to_path_buf(),
        });
    }
    String::from_utf8(bytes).map_err(|err| {
        let at = err.utf8_error().valid_up_to();
        let bytes = err.as_bytes();
        // The prefix up to the bad byte is valid UTF-8 by definition.
        let valid = std::str::from_utf8(&bytes[..at]).unwrap_or_default();
        let (line, column) = LineIndex::new(valid).position(valid, at);
        ConfigError::Syntax {
            path: path.to_path_buf(),
            line: Some(line),
            column: Some(column),
            message: format!(
                "not UTF-8 text: byte 0x{:02x} at offset {at} (a config file is UTF-8)",
                bytes.get(at).copied().unwrap_or_default()
            ),
        }
    })
}

/// Where each line of a text starts, to turn byte offsets into lines and columns.
pub struct LineIndex {
    starts: Vec<usize>,
}

impl LineIndex {
    pub fn new(text: &str) -> LineIndex {
        let starts = std::iter::once(0)
            .chain(text.match_indices('\n').map(|(i, _)| i + 1))
            .collect();
        LineIndex { starts }
    }

    /// 1-based line of byte `offset`.
    pub fn line(&self, offset: usize) -> usize {
        self.starts.partition_point(|&start| start <= offset).max(1)
    }

    /// 1-based (line, column) of byte `offset` in `text` (the text the index was built
    /// from); the column counts characters from the line's start.
    pub fn position(&self, text: &str, offset: usize) -> (usize, usize) {
        let offset = offset.min(text.len());
        let line = self.line(offset);
        let start = self.starts.get(line - 1).copied().unwrap_or_default();
        let column = match text.get(start..offset) {
            Some(prefix) => prefix.chars().count(),
            // Not on a character boundary (never for a parser's span): count bytes.
            None => offset - start,
        };
        (line, column + 1)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use super::*;

    #[test]
    fn positions_are_one_based_and_count_characters() {
        let text = "ab\nü = 1\n\nlast";
        let index = LineIndex::new(text);
        let at = |needle: &str| index.position(text, text.find(needle).unwrap());
        assert_eq!(at("ab"), (1, 1));
        assert_eq!(at("b"), (1, 2));
        assert_eq!(at("ü"), (2, 1));
        // 'ü' is two bytes and one column.
        assert_eq!(at("= 1"), (2, 3));
        assert_eq!(at("last"), (4, 1));
        assert_eq!(index.position(text, text.len()), (4, 5));
        assert_eq!(index.position(text, usize::MAX), (4, 5));
    }

    #[test]
    fn read_file_refuses_what_is_not_a_config() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, b"a = 1\nname = \"caf\xe9\"\n").unwrap();
        let err = read_file(&path).unwrap_err().to_string();
        assert_eq!(
            err,
            format!(
                "{}:2:12: not UTF-8 text: byte 0xe9 at offset 17 (a config file is UTF-8)",
                path.display()
            )
        );
        // Sparse: no disk used, the reader stops at the cap.
        let file = std::fs::File::create(&path).unwrap();
        file.set_len(MAX_CONFIG_BYTES + 1).unwrap();
        let err = read_file(&path).unwrap_err();
        assert!(matches!(err, ConfigError::TooLarge { .. }), "{err}");
        assert!(err.to_string().contains("larger than 16 MiB"), "{err}");
        file.set_len(MAX_CONFIG_BYTES).unwrap();
        assert_eq!(read_file(&path).unwrap().len() as u64, MAX_CONFIG_BYTES);
        let err = read_file(&dir.path().join("missing.toml")).unwrap_err();
        assert!(matches!(err, ConfigError::Read { .. }), "{err}");
    }
}
