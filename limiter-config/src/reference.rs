//! The config reference, written from the schema's rows: a Markdown page (docs/config.md)
//! and a section 5 man page per binary (`limiter.toml(5)`). Key, type, default, bounds,
//! when a change applies and help come from the [`Key`] rows the checker reads, so the
//! reference cannot describe a key the checker does not have, nor miss one.

use std::fmt::Write as _;

use crate::schema::{Absent, Applies, Key, Kind, Section};

/// The manual section of file formats.
pub const MAN_SECTION: &str = "5";

/// One binary's config file.
#[derive(Debug, Clone, Copy)]
pub struct Reference {
    /// The binary that reads the file (`limiter`).
    pub binary: &'static str,
    /// The man page's name (`limiter.toml`), written as `NAME.5`.
    pub page: &'static str,
    /// Where the packaged unit reads it.
    pub path: &'static str,
    /// One line: what the file configures.
    pub about: &'static str,
    /// The file's top level.
    pub schema: &'static Section,
    /// Man pages to see also (`limiter(8)`).
    pub see_also: &'static [&'static str],
}

/// The "type" column.
pub fn type_of(kind: &Kind) -> String {
    match kind {
        Kind::Integer { .. } => "integer".into(),
        Kind::String => "string".into(),
        Kind::Path => "path".into(),
        Kind::Word(_) => "word".into(),
        Kind::SocketAddr => "address:port".into(),
        Kind::IpAddr => "IP address".into(),
        Kind::Table(section) => format!("table {}", section.name),
        Kind::Tables(section) => format!("array of tables {}", section.name),
        Kind::Other(text) => (*text).into(),
    }
}

/// The "bounds" column: an integer's range, a word's spellings; empty for the rest, and
/// for an integer the row leaves unbounded: the checks of its own that hold it are the
/// help's to say (a rate's and a burst's depend on each other).
pub fn bounds_of(kind: &Kind) -> String {
    match kind {
        Kind::Integer { max: u64::MAX, .. } => String::new(),
        Kind::Integer { min, max } => format!("{min} to {max}"),
        Kind::Word(words) => words
            .iter()
            .map(|w| format!("\"{w}\""))
            .collect::<Vec<_>>()
            .join(", "),
        _ => String::new(),
    }
}

/// The "default" column.
pub fn default_of(absent: &Absent) -> String {
    match absent {
        Absent::Required => "required".into(),
        Absent::Int(n) => n.to_string(),
        Absent::Str(s) => format!("\"{s}\""),
        Absent::Unset(text) => format!("unset: {text}"),
    }
}

/// The "applies" column.
pub fn applies_of(applies: &Applies) -> String {
    match applies {
        Applies::Reload => "reload".into(),
        Applies::Restart => "restart".into(),
        Applies::Partly(text) => (*text).into(),
    }
}

/// `section` and the tables under it, each once, in the order the docs list them.
fn sections(section: &'static Section) -> Vec<&'static Section> {
    let mut all = vec![section];
    let mut at = 0;
    while at < all.len() {
        for key in all[at].keys {
            if let Kind::Table(sub) | Kind::Tables(sub) = key.kind {
                if !all.iter().any(|s| std::ptr::eq(*s, sub)) {
                    all.push(sub);
                }
            }
        }
        at += 1;
    }
    all
}

fn title(section: &Section) -> &str {
    if section.name.is_empty() {
        "top level"
    } else {
        section.name
    }
}

fn cell(text: &str) -> String {
    text.replace('|', "\\|")
}

fn code_cell(text: &str) -> String {
    if text.is_empty() {
        String::new()
    } else {
        format!("`{}`", cell(text))
    }
}

impl Reference {
    /// Writes [`Self::man_page`] as `DIR/PAGE.5`.
    pub fn write_man_page(&self, version: &str, dir: &std::path::Path) -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        std::fs::write(
            dir.join(format!("{}.{MAN_SECTION}", self.page)),
            self.man_page(version),
        )
    }

    /// The binary's part of docs/config.md: a heading, then a table per section.
    pub fn markdown(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "## {}: {}\n", self.binary, self.path);
        let _ = writeln!(
            out,
            "Man page `{}({MAN_SECTION})`: {}.\n",
            self.page, self.about
        );
        for section in sections(self.schema) {
            let _ = writeln!(out, "### {} {}\n", self.binary, title(section));
            out.push_str("| key | type | default | bounds | applies at | help |\n");
            out.push_str("|---|---|---|---|---|---|\n");
            for key in section.keys {
                let default = match key.absent {
                    Absent::Int(_) | Absent::Str(_) => code_cell(&default_of(&key.absent)),
                    _ => cell(&default_of(&key.absent)),
                };
                let _ = writeln!(
                    out,
                    "| `{}` | {} | {} | {} | {} | {} |",
                    key.name,
                    cell(&type_of(&key.kind)),
                    default,
                    cell(&bounds_of(&key.kind)),
                    cell(&applies_of(&key.applies)),
                    cell(key.help),
                );
            }
            out.push('\n');
        }
        out
    }

    /// The man page `NAME.5` in roff.
    pub fn man_page(&self, version: &str) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            ".TH {} {MAN_SECTION} \"\" \"{} {}\" \"File Formats\"",
            roff(&self.page.to_uppercase()),
            self.binary,
            roff(version)
        );
        let _ = writeln!(
            out,
            ".SH NAME\n{} \\- {}",
            roff(self.page),
            roff(self.about)
        );
        let _ = writeln!(out, ".SH SYNOPSIS\n{}", roff(self.path));
        let _ = writeln!(
            out,
            ".SH DESCRIPTION\nA TOML file read by\n.BR {} (8).\n\
             Each key below gives its type, its default (or that it is required), its \
             bounds, and when a change applies: at a reload\n(\\fB{} reload\\fR or SIGHUP, \
             where the binary has one) or at the next start.\n\
             \\fB{} check \\-\\-config FILE\\fR judges a file without running anything.",
            self.binary, self.binary, self.binary
        );
        for section in sections(self.schema) {
            let _ = writeln!(out, ".SH \"{}\"", roff(&title(section).to_uppercase()));
            for key in section.keys {
                man_key(&mut out, key);
            }
        }
        let _ = writeln!(out, ".SH \"SEE ALSO\"");
        let see: Vec<String> = self
            .see_also
            .iter()
            .map(|page| {
                let (name, section) = page.split_once('(').unwrap_or((page, ""));
                format!(".BR {} ({}", roff(name), section)
            })
            .collect();
        let _ = writeln!(out, "{}", see.join(" ,\n"));
        out
    }
}

fn man_key(out: &mut String, key: &Key) {
    let _ = writeln!(out, ".TP\n.B {}", roff(key.name));
    let mut facts = vec![type_of(&key.kind), default_of(&key.absent)];
    let bounds = bounds_of(&key.kind);
    if !bounds.is_empty() {
        facts.push(bounds);
    }
    facts.push(format!("applies at: {}", applies_of(&key.applies)));
    let _ = writeln!(out, "{}.", roff(&facts.join("; ")));
    let _ = writeln!(out, ".br\n{}", roff(key.help));
}

/// Text made safe for roff: backslashes and hyphens escaped, characters beyond ASCII
/// as groff's `\[uXXXX]` (whatever the reader's locale), no line starting a request.
fn roff(text: &str) -> String {
    let escaped: String = text
        .chars()
        .map(|c| match c {
            '\\' => "\\e".to_string(),
            '-' => "\\-".to_string(),
            c if c.is_ascii() => c.to_string(),
            c => format!("\\[u{:04X}]", u32::from(c)),
        })
        .collect();
    escaped
        .lines()
        .map(|line| {
            if line.starts_with(['.', '\'']) {
                format!("\\&{line}")
            } else {
                line.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    crate::section! {
        INNER = "[[inner]]", Applies::Reload {
            INNER_N = "n", Absent::Int(3), Kind::Integer { min: 0, max: 9 }, "a | number";
        }
    }
    crate::section! {
        OUTER = "", Applies::Restart {
            MODE = "mode", Absent::Str("fast"), Kind::Word(&["fast", "slow"]), "how";
            NAME = "name", Absent::Required, Kind::Path, ".dot-led help";
            INNER_KEY = "inner", Absent::Unset("none"), Kind::Tables(&INNER), "more", Applies::Partly("some at a reload");
            AGAIN = "again", Absent::Unset("none"), Kind::Table(&INNER), "the same table again";
        }
    }

    const DEMO: Reference = Reference {
        binary: "demo",
        page: "demo.toml",
        path: "/etc/demo.toml",
        about: "the demo's configuration",
        schema: &OUTER,
        see_also: &["demo(8)", "demo-check(8)"],
    };

    /// Every row, every column, each section once, pipes escaped.
    #[test]
    fn markdown_has_a_row_a_key() {
        assert_eq!(
            DEMO.markdown(),
            "## demo: /etc/demo.toml\n\n\
             Man page `demo.toml(5)`: the demo's configuration.\n\n\
             ### demo top level\n\n\
             | key | type | default | bounds | applies at | help |\n\
             |---|---|---|---|---|---|\n\
             | `mode` | word | `\"fast\"` | \"fast\", \"slow\" | restart | how |\n\
             | `name` | path | required |  | restart | .dot-led help |\n\
             | `inner` | array of tables [[inner]] | unset: none |  | some at a reload | more |\n\
             | `again` | table [[inner]] | unset: none |  | restart | the same table again |\n\n\
             ### demo [[inner]]\n\n\
             | key | type | default | bounds | applies at | help |\n\
             |---|---|---|---|---|---|\n\
             | `n` | integer | `3` | 0 to 9 | reload | a \\| number |\n\n"
        );
    }

    /// The page is roff a man reader takes: a title in section 5, no line that starts a
    /// request by accident, hyphens escaped.
    #[test]
    fn man_page_is_escaped_roff() {
        let page = DEMO.man_page("1.2-3");
        assert!(
            page.starts_with(".TH DEMO.TOML 5 \"\" \"demo 1.2\\-3\" \"File Formats\"\n"),
            "{page}"
        );
        assert!(
            page.contains(
                ".TP\n.B name\npath; required; applies at: restart.\n.br\n\\&.dot\\-led help\n"
            ),
            "{page}"
        );
        assert!(page.contains(".SH \"[[INNER]]\"\n.TP\n.B n\n"), "{page}");
        assert!(
            page.ends_with(".BR demo (8) ,\n.BR demo\\-check (8)\n"),
            "{page}"
        );
        for line in page.lines() {
            assert!(
                !line.starts_with('\'') && !line.starts_with(". ") && !line.starts_with(".d"),
                "{line}"
            );
        }
    }

    #[test]
    fn roff_escapes_what_groff_would_misread() {
        assert_eq!(
            roff("a-b \\ 2 × 3 → ≥"),
            "a\\-b \\e 2 \\[u00D7] 3 \\[u2192] \\[u2265]"
        );
        assert_eq!(roff("'quoted\n.dot"), "\\&'quoted\n\\&.dot");
    }

    #[test]
    fn integer_bounds_and_types() {
        assert_eq!(
            bounds_of(&Kind::Integer {
                min: 1,
                max: u64::MAX
            }),
            ""
        );
        assert_eq!(bounds_of(&Kind::Integer { min: 1, max: 9 }), "1 to 9");
        assert_eq!(type_of(&Kind::IpAddr), "IP address");
    }
}
