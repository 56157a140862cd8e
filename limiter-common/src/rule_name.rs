//! The grammar of a rule's name, once: the daemon's config checker, the fleet protocol's
//! report check and the allocator's config all hold names to it.

use core::fmt;

use crate::abi::RULE_NAME_LEN;

/// The longest name, in bytes: the kernel's rule entry holds it NUL-terminated.
pub const MAX_LEN: usize = RULE_NAME_LEN - 1;

/// What is wrong with a name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Problem {
    Empty,
    /// Its length in bytes.
    TooLong(usize),
    /// The first character outside `[A-Za-z0-9._-]`.
    Char(char),
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::Empty => write!(f, "name must not be empty"),
            Problem::TooLong(n) => {
                write!(f, "name is {n} bytes long; at most {MAX_LEN} are allowed")
            }
            Problem::Char(c) => write!(
                f,
                "name contains {c:?}; only letters, digits, '.', '_' and '-' are allowed"
            ),
        }
    }
}

/// Whether `name` may name a rule: 1 to [`MAX_LEN`] bytes of `[A-Za-z0-9._-]`.
pub fn check(name: &str) -> Result<(), Problem> {
    if name.is_empty() {
        return Err(Problem::Empty);
    }
    if name.len() > MAX_LEN {
        return Err(Problem::TooLong(name.len()));
    }
    match name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        Some(c) => Err(Problem::Char(c)),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_held_to_the_grammar() {
        assert_eq!(check("web-1.example_a"), Ok(()));
        assert_eq!(check(""), Err(Problem::Empty));
        assert_eq!(check(&"a".repeat(MAX_LEN)), Ok(()));
        assert_eq!(
            check(&"a".repeat(MAX_LEN + 1)),
            Err(Problem::TooLong(MAX_LEN + 1))
        );
        assert_eq!(check("a b"), Err(Problem::Char(' ')));
        assert_eq!(check("é"), Err(Problem::Char('é')));
    }

    proptest::proptest! {
        /// Exactly the names of 1 to MAX_LEN bytes of the grammar's characters pass.
        #[test]
        fn a_name_passes_exactly_when_the_grammar_says(name in "[A-Za-z0-9._ é/-]{0,70}") {
            let grammar = !name.is_empty()
                && name.len() <= MAX_LEN
                && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
            proptest::prop_assert_eq!(check(&name).is_ok(), grammar);
        }
    }
}
