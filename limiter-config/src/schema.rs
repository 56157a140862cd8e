//! The keys of a config file as data: one [`Key`] row a key (name, what its absence
//! means, how its value is read, help), grouped in a [`Section`] per table. The
//! unknown-key check lists a section's names, the checker's keyed readers
//! ([`Checker::integer_key`](crate::Checker::integer_key) …) take bounds and defaults
//! from the row, and [`Section::documentation_gaps`] holds the docs to the rows.

/// What an absent key means: the "required / default" column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Absent {
    /// The key must be given.
    Required,
    /// This integer.
    Int(u64),
    /// This string (a word, a path, an address).
    Str(&'static str),
    /// Nothing is set; the text says what that means ("any port", "the hostname").
    Unset(&'static str),
}

/// How a key's value is read: the "parser" column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// An integer in `min..=max`.
    Integer { min: u64, max: u64 },
    /// Any string.
    String,
    /// A non-empty path.
    Path,
    /// One of these words.
    Word(&'static [&'static str]),
    /// `address:port`.
    SocketAddr,
    /// An IP address.
    IpAddr,
    /// A table of these keys.
    Table(&'static Section),
    /// An array of tables of these keys (`[[name]]`).
    Tables(&'static Section),
    /// Read by code of its own; the text says what it takes.
    Other(&'static str),
}

/// When a changed value takes effect: the "live or restart" column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applies {
    /// At a reload (`limiter reload`, SIGHUP): the running program takes it.
    Reload,
    /// At the next start; a reload leaves the running value (and says it waits).
    Restart,
    /// Some changes at a reload, others at the next start: the text says which.
    Partly(&'static str),
}

/// One key of a table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Key {
    pub name: &'static str,
    pub absent: Absent,
    pub kind: Kind,
    pub help: &'static str,
    pub applies: Applies,
}

impl Key {
    pub const fn required(&self) -> bool {
        matches!(self.absent, Absent::Required)
    }

    /// The default as the config spells it (`3000`, `"auto"`), when there is one.
    pub fn default_spelling(&self) -> Option<String> {
        match self.absent {
            Absent::Int(n) => Some(n.to_string()),
            Absent::Str(s) => Some(format!("\"{s}\"")),
            Absent::Required | Absent::Unset(_) => None,
        }
    }
}

/// The keys of one table, in the order the docs list them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Section {
    /// How the docs name the table: `""` for the top level, `[fleet]`, `[[rules]]`.
    pub name: &'static str,
    pub keys: &'static [Key],
}

/// A certificate or key file's row: the path is read at start, the file itself again for
/// every new TLS handshake (so renewed certificates need no restart).
pub const TLS_FILE: Applies =
    Applies::Partly("restart: the path; the file, renewed: at the next TLS handshake");

/// A row's own [`Applies`] if it gives one, else its section's (for [`section!`]).
#[doc(hidden)]
pub const fn applies_of(row: &[Applies], section: Applies) -> Applies {
    match row {
        [own] => *own,
        _ => section,
    }
}

impl Section {
    /// The key names: what the unknown-key check accepts.
    pub fn names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.keys.iter().map(|k| k.name)
    }

    pub fn key(&self, name: &str) -> Option<&'static Key> {
        self.keys.iter().find(|k| k.name == name)
    }

    /// Keys of this section and the sections under it that `doc` (a README, an example
    /// config) does not show, each with what is missing. A key is shown by a line
    /// `name = …` (commented out or not; a table also by `[…name]`), and a key with a
    /// default by such a line giving the default, or saying `default DEFAULT`.
    pub fn documentation_gaps(&self, doc: &str) -> Vec<String> {
        let mut gaps = Vec::new();
        self.gaps_into(doc, &mut gaps);
        gaps
    }

    fn gaps_into(&self, doc: &str, gaps: &mut Vec<String>) {
        for key in self.keys {
            let assigned = format!("{} =", key.name);
            let lines: Vec<&str> = doc
                .lines()
                .map(|l| l.trim_start_matches(|c: char| c == '#' || c.is_whitespace()))
                .filter(|l| {
                    l.starts_with(&assigned)
                        || l.starts_with('[') && l.contains(&format!("{}]", key.name))
                })
                .collect();
            let where_ = if self.name.is_empty() {
                "top level"
            } else {
                self.name
            };
            if lines.is_empty() {
                gaps.push(format!("{where_}: {} is not shown", key.name));
                continue;
            }
            if let Some(default) = key.default_spelling() {
                let given = format!("{} = {default}", key.name);
                let said = format!("default {}", default.trim_matches('"'));
                if !lines
                    .iter()
                    .any(|l| l.starts_with(&given) || l.contains(&said))
                {
                    gaps.push(format!(
                        "{where_}: {} is not shown with its default {default}",
                        key.name
                    ));
                }
            }
            if let Kind::Table(section) | Kind::Tables(section) = key.kind {
                section.gaps_into(doc, gaps);
            }
        }
    }
}

/// `KEY is required in [TABLE]` (`KEY is required` at the top level).
pub fn required_message(section: &Section, key: &Key) -> String {
    if section.name.is_empty() {
        format!("{} is required", key.name)
    } else {
        format!("{} is required in {}", key.name, section.name)
    }
}

/// Defines a [`Section`] and a named [`Key`] constant for each of its rows, so that a
/// key is one row: `CONST = "name", absent, kind, "help";`. The title is followed by
/// when a change of the section's keys takes effect (`SECTION = "[t]", Applies::Reload
/// ...`); a row that differs says so after its help (`"help", Applies::Restart;`).
///
/// With `=> struct NAME` after the title, a row may also name the field it fills,
/// `CONST = "name" => field: Type, absent, kind, "help";`: the macro then defines the
/// struct of those fields (the help as their doc) and `NAME::read(checker, table,
/// prefix)`, which reads each by its row ([`FromRow`](crate::FromRow)). A plain key is
/// then its row alone; rows without a field are read by hand.
#[macro_export]
macro_rules! section {
    ($(#[$meta:meta])* $section:ident = $title:literal, $applies:path => $(#[$smeta:meta])* struct $strukt:ident {
        $($(#[$kmeta:meta])* $konst:ident = $name:literal $(=> $field:ident : $ty:ty)?,
            $absent:expr, $kind:expr, $help:literal $(, $row_applies:expr)?;)+
    }) => {
        $crate::section! {
            $(#[$meta])* $section = $title, $applies {
                $($(#[$kmeta])* $konst = $name, $absent, $kind, $help $(, $row_applies)?;)+
            }
        }

        $(#[$smeta])*
        pub struct $strukt {
            $($(#[doc = $help] pub $field: $ty,)?)+
        }

        impl $strukt {
            /// Each field's key in `table`, read by its row (`None`: wrong or missing,
            /// reported). `span` is the table's (where a missing required key is
            /// reported), `prefix` its field path (`""` at the top level).
            fn read_fields(
                checker: &mut $crate::Checker<'_>,
                table: &$crate::toml::de::DeTable<'_>,
                span: ::std::ops::Range<usize>,
                prefix: &str,
            ) -> ($($(::std::option::Option<$ty>,)?)+) {
                $($(
                    let path = $crate::field_path(prefix, $name);
                    let $field = <$ty as $crate::FromRow>::read(
                        checker,
                        table,
                        &$konst,
                        $crate::At::top(&path),
                    );
                    if $konst.required() && table.get($name).is_none() {
                        checker.report(
                            span.clone(),
                            $crate::At::top(&path),
                            $crate::schema::required_message(&$section, &$konst),
                        );
                    }
                )?)+
                ($($($field,)?)+)
            }

            /// Reads every field's key (see `read_fields`); `None` when any is wrong or
            /// missing. Every problem is reported, not only the first.
            pub fn read(
                checker: &mut $crate::Checker<'_>,
                table: &$crate::toml::de::DeTable<'_>,
                span: ::std::ops::Range<usize>,
                prefix: &str,
            ) -> ::std::option::Option<$strukt> {
                let ($($($field,)?)+) = Self::read_fields(checker, table, span, prefix);
                ::std::option::Option::Some($strukt {
                    $($($field: $field?,)?)+
                })
            }

            /// [`Self::read`], a wrong or missing key taking its value from `fallback`,
            /// so that the checks relating keys see the others as the file gives them.
            pub fn read_or(
                checker: &mut $crate::Checker<'_>,
                table: &$crate::toml::de::DeTable<'_>,
                span: ::std::ops::Range<usize>,
                prefix: &str,
                fallback: &$strukt,
            ) -> $strukt {
                let ($($($field,)?)+) = Self::read_fields(checker, table, span, prefix);
                $strukt {
                    $($($field: $field
                        .unwrap_or_else(|| ::std::clone::Clone::clone(&fallback.$field)),)?)+
                }
            }
        }
    };
    ($(#[$meta:meta])* $section:ident = $title:literal, $applies:path {
        $($(#[$kmeta:meta])* $konst:ident = $name:literal, $absent:expr, $kind:expr, $help:literal $(, $row_applies:expr)?;)+
    }) => {
        $($(#[$kmeta])*
        pub const $konst: $crate::Key = $crate::Key {
            name: $name,
            absent: $absent,
            kind: $kind,
            help: $help,
            applies: $crate::schema::applies_of(&[$($row_applies)?], $applies),
        };)+
        $(#[$meta])*
        pub const $section: $crate::Section = $crate::Section {
            name: $title,
            keys: &[$($konst),+],
        };
    };
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use super::*;

    crate::section! {
        INNER = "[inner]", Applies::Reload {
            INNER_N = "n", Absent::Int(3), Kind::Integer { min: 0, max: 9 }, "a number";
        }
    }
    crate::section! {
        OUTER = "", Applies::Restart {
            MODE = "mode", Absent::Str("fast"), Kind::Word(&["fast", "slow"]), "how";
            NAME = "name", Absent::Required, Kind::String, "who";
            TABLE = "inner", Absent::Unset("none"), Kind::Table(&INNER), "more", Applies::Reload;
        }
    }

    crate::config_enum!(
        Speed, "speed" {
            Fast = "fast",
            Slow = "slow",
        }
    );

    crate::section! {
        PLAIN = "[plain]", Applies::Restart => #[derive(Debug, PartialEq)] struct Plain {
            PLAIN_SPEED = "speed" => speed: Speed, Absent::Str("fast"), Kind::Word(Speed::SPELLINGS), "how fast";
            PLAIN_COUNT = "count" => count: u8, Absent::Int(3), Kind::Integer { min: 1, max: 9 }, "how many";
            PLAIN_OTHER = "other", Absent::Unset("none"), Kind::Other("by hand"), "read by hand";
            PLAIN_LABEL = "label" => label: String, Absent::Required, Kind::String, "a label";
        }
    }

    fn read_plain(text: &str) -> (Option<Plain>, String) {
        let path = std::path::Path::new("t.toml");
        let Ok(root) = crate::Checker::parse(text, path) else {
            panic!("not TOML: {text}");
        };
        let mut c = crate::Checker::new(text);
        let plain = Plain::read(&mut c, root.get_ref(), root.span(), "plain");
        let shown = c
            .finish(path)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        (plain, shown)
    }

    /// A struct section: each field read by its row (defaults from the row, bounds and
    /// words checked, on the field's path), every wrong key reported before `None`.
    #[test]
    fn a_struct_section_reads_each_field_by_its_row() {
        assert_eq!(
            read_plain("label = \"x\"\n"),
            (
                Some(Plain {
                    speed: Speed::Fast,
                    count: 3,
                    label: "x".into()
                }),
                String::new()
            )
        );
        assert_eq!(
            read_plain("speed = \"slow\"\ncount = 9\nlabel = \"y\"\nother = 1\n").0,
            Some(Plain {
                speed: Speed::Slow,
                count: 9,
                label: "y".into()
            })
        );
        let (plain, shown) = read_plain("speed = \"warp\"\ncount = 10\n");
        assert_eq!(plain, None);
        assert_eq!(
            shown,
            "t.toml:1:1: plain.label: label is required in [plain]\n\
             t.toml:1:9: plain.speed: unknown speed \"warp\"; expected one of \"fast\", \"slow\"\n\
             t.toml:2:9: plain.count: must be between 1 and 9, got 10"
        );
        // read_or: a wrong key takes the fallback's value, the others the file's.
        let text = "speed = \"slow\"\ncount = 0\nlabel = \"z\"\n";
        let root = crate::Checker::parse(text, std::path::Path::new("t.toml")).unwrap();
        let mut c = crate::Checker::new(text);
        let fallback = Plain {
            speed: Speed::Fast,
            count: 5,
            label: "f".into(),
        };
        let read = Plain::read_or(&mut c, root.get_ref(), root.span(), "plain", &fallback);
        assert_eq!(
            (read, c.count()),
            (
                Plain {
                    speed: Speed::Slow,
                    count: 5,
                    label: "z".into()
                },
                1
            )
        );
        assert_eq!(
            PLAIN.names().collect::<Vec<_>>(),
            ["speed", "count", "other", "label"]
        );
    }

    #[test]
    fn documentation_gaps_name_what_the_doc_misses() {
        let good = "mode = \"fast\"\nname = \"x\"\n[inner]\n# n = 3\n";
        assert_eq!(OUTER.documentation_gaps(good), Vec::<String>::new());
        let said = "mode = \"slow\"  # fast | slow (default fast)\nname = \"x\"\n[inner]\nn = 3\n";
        assert_eq!(OUTER.documentation_gaps(said), Vec::<String>::new());
        let bad = "mode = \"slow\"\n[inner]\nn = 4\n";
        assert_eq!(
            OUTER.documentation_gaps(bad),
            [
                "top level: mode is not shown with its default \"fast\"",
                "top level: name is not shown",
                "[inner]: n is not shown with its default 3",
            ]
        );
        assert_eq!(OUTER.names().collect::<Vec<_>>(), ["mode", "name", "inner"]);
        assert_eq!(OUTER.key("inner").map(|k| k.required()), Some(false));
        assert!(NAME.required());
        // The section's timing, unless the row gives its own.
        assert_eq!(
            [MODE.applies, TABLE.applies, INNER_N.applies],
            [Applies::Restart, Applies::Reload, Applies::Reload]
        );
    }
}
