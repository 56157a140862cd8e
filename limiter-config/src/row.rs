//! Reading a key by its schema row into the type of the field it fills: what lets a
//! plain key (an integer, a word, a path, a string) be one row of a `section!` with a
//! struct, its field and reading generated from the row.

use std::path::PathBuf;

use toml::de::DeTable;

use crate::{At, Checker, ConfigWord, Key};

/// A field type a schema row can be read into.
pub trait FromRow: Sized {
    /// `key`'s value in `table`, or the row's default when absent. `None` when the value
    /// is wrong (reported at `at`) or absent without a default.
    fn read(c: &mut Checker<'_>, table: &DeTable<'_>, key: &Key, at: At<'_>) -> Option<Self>;
}

impl FromRow for u64 {
    fn read(c: &mut Checker<'_>, table: &DeTable<'_>, key: &Key, at: At<'_>) -> Option<u64> {
        c.integer_key(table, key, at)
    }
}

/// Narrower integers: the row's bounds must fit the type; a row whose bounds do not is a
/// bug of the program, reported like a problem.
macro_rules! narrow_integer {
    ($($ty:ty),+) => {$(
        impl FromRow for $ty {
            fn read(c: &mut Checker<'_>, table: &DeTable<'_>, key: &Key, at: At<'_>) -> Option<$ty> {
                let n = c.integer_key(table, key, at)?;
                match <$ty>::try_from(n) {
                    Ok(v) => Some(v),
                    Err(_) => {
                        c.schema_bug(key, at, concat!("allows values beyond ", stringify!($ty)));
                        None
                    }
                }
            }
        }
    )+};
}

narrow_integer!(u32, u16, u8);

impl FromRow for String {
    fn read(c: &mut Checker<'_>, table: &DeTable<'_>, key: &Key, at: At<'_>) -> Option<String> {
        c.string_key(table, key, at).map(str::to_string)
    }
}

impl FromRow for PathBuf {
    fn read(c: &mut Checker<'_>, table: &DeTable<'_>, key: &Key, at: At<'_>) -> Option<PathBuf> {
        c.path_key(table, key, at)
    }
}

impl<E: ConfigWord> FromRow for E {
    fn read(c: &mut Checker<'_>, table: &DeTable<'_>, key: &Key, at: At<'_>) -> Option<E> {
        c.word_key(table, key, at)
    }
}

/// The dotted path of key `name` in the table at `prefix` (`""` at the top level).
pub fn field_path(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_string()
    } else {
        format!("{prefix}.{name}")
    }
}
