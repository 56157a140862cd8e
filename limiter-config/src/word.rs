//! Values the config spells as one of a fixed set of words (`xdp_mode = "native"`).

/// A value the config spells as one of a fixed set of words.
pub trait ConfigWord: Copy + 'static {
    /// The key it is the value of, for messages.
    const KEY: &'static str;

    /// Every value, in the order the config documents them.
    fn all() -> &'static [Self];

    /// The spelling in the config file.
    fn spelling(self) -> &'static str;

    /// The value spelled `s`; else a message naming the key, `s` and every spelling.
    fn from_spelling(s: &str) -> Result<Self, String> {
        Self::all()
            .iter()
            .copied()
            .find(|v| v.spelling() == s)
            .ok_or_else(|| unknown_value(Self::KEY, s, Self::all().iter().map(|v| v.spelling())))
    }
}

/// `unknown KEY "GOT"; expected one of "A", "B"`.
pub fn unknown_value<'a>(what: &str, got: &str, expected: impl Iterator<Item = &'a str>) -> String {
    let expected: Vec<String> = expected.map(|s| format!("\"{s}\"")).collect();
    format!(
        "unknown {what} \"{got}\"; expected one of {}",
        expected.join(", ")
    )
}

/// Defines a config enum: its variants, their config spellings (`as_str`, `SPELLINGS`),
/// `Display`, `FromStr` and [`ConfigWord`](crate::ConfigWord).
#[macro_export]
macro_rules! config_enum {
    ($(#[$meta:meta])* $name:ident, $what:literal { $($(#[$vmeta:meta])* $variant:ident = $text:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name {
            $($(#[$vmeta])* $variant),+
        }

        impl $name {
            /// Every value, in the order the config documents them.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// Every spelling, in the same order (the schema's parser column).
            pub const SPELLINGS: &'static [&'static str] = &[$($text),+];

            /// The spelling in the config file.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text),+
                }
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl $crate::ConfigWord for $name {
            const KEY: &'static str = $what;

            fn all() -> &'static [Self] {
                $name::ALL
            }

            fn spelling(self) -> &'static str {
                self.as_str()
            }
        }

        impl ::std::str::FromStr for $name {
            type Err = String;

            fn from_str(s: &str) -> Result<Self, String> {
                <$name as $crate::ConfigWord>::from_spelling(s)
            }
        }
    };
}
